"""A pacer.torch worker of a --data-stream job: the usual epoch loop,
`for epoch in range(--loops): for x, y in loader:`. Writes, per iteration
of the outer loop, the loader's epoch and the dataset indices of every
batch trained in it, as JSON lines to --out."""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "worker",
                                "python", "examples"))
import fashion_mnist  # noqa: E402

import pacer.torch as pt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loops", type=int, default=5)
    ap.add_argument("--train-limit", type=int, default=3000)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    pt.init()
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
    model, opt = pt.distribute(net, torch.optim.SGD(net.parameters(), lr=0.1))
    train = fashion_mnist.load(train=True, limit=args.train_limit)
    loader = pt.DataLoader(train)
    with open(args.out, "w") as out:
        for loop in range(args.loops):
            seen = []
            for x, y in loader:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step(loss=loss)
                seen.extend(int(i) for i in loader.samples)
            out.write(json.dumps({"loop": loop, "epoch": loader.epoch, "samples": seen}) + "\n")
            out.flush()
    pt.shutdown()


if __name__ == "__main__":
    main()
