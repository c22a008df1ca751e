"""A pacer.torch worker whose DataLoader reads with loader processes
(--num-workers N, spawned): every batch must hold exactly the dataset's
items at the indices the monitor gave. Prints 'batches B samples S'."""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "worker",
                                "python", "examples"))
import fashion_mnist  # noqa: E402

import pacer.torch as pt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-workers", type=int, default=2)
    ap.add_argument("--train-limit", type=int, default=2000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    pt.init()
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
    model, opt = pt.distribute(net, torch.optim.SGD(net.parameters(), lr=0.1))
    train = fashion_mnist.load(train=True, limit=args.train_limit)
    loader = pt.DataLoader(train, num_workers=args.num_workers)
    batches = samples = 0
    while not loader.stopped:  # an iteration per epoch of the job, until it stops
        for x, y in loader:
            want_x, want_y = train[torch.from_numpy(loader.samples.astype("int64"))]
            assert torch.equal(x, want_x) and torch.equal(y, want_y), "batch %d differs" % batches
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step(loss=loss)
            batches += 1
            samples += len(y)
    pt.shutdown()
    print("batches %d samples %d" % (batches, samples))


if __name__ == "__main__":
    main()
