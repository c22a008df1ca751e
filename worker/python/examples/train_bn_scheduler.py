"""A CNN with BatchNorm and a learning-rate schedule, trained with Pacer.

    pacer-run --workers 2 -- /usr/bin/python3 train_bn_scheduler.py

The scheduler (CosineAnnealingLR, which changes only lr)
runs on the worker's side, and each push carries the lr it set; the shards
step with it. BatchNorm's running statistics are module buffers: each
worker keeps its own (pacer.torch warns), so the evaluating worker
evaluates with the statistics of the data it trained on.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fashion_mnist  # noqa: E402

import pacer.torch as pt  # noqa: E402


def net():
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 7 * 7, 10))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2000, help="the schedule's length")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--test-limit", type=int, default=2000)
    ap.add_argument("--train-limit", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(1)
    pt.init()
    m = net()
    # No weight decay on biases and BatchNorm's weights: a second group.
    decay = [p for n, p in m.named_parameters() if p.dim() > 1]
    no_decay = [p for n, p in m.named_parameters() if p.dim() <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 5e-4},
                           {"params": no_decay, "weight_decay": 0.0}], lr=0.1, momentum=0.9)
    model, opt = pt.distribute(m, opt)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    train = fashion_mnist.load(train=True, limit=args.train_limit)
    test = None
    loader = pt.DataLoader(train)
    while not loader.stopped:  # an iteration per epoch of the job, until it stops
        for x, y in loader:
            model.train()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step(loss=loss)
            if loader.step < args.steps:
                schedule.step()
            if pt.is_evaluator() and loader.step % args.eval_every == 0:
                if test is None:
                    test = fashion_mnist.load(train=False, limit=args.test_limit)
                model.eval()
                with torch.no_grad():
                    xs, ys = test.tensors
                    logits = model(xs)
                    accuracy = (logits.argmax(dim=1) == ys).float().mean().item()
                    pt.report(accuracy=accuracy,
                              loss=torch.nn.functional.cross_entropy(logits, ys).item(),
                              samples=len(ys))
    print(pt.shutdown())


if __name__ == "__main__":
    main()
