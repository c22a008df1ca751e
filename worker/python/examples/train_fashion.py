"""A PyTorch model on Fashion-MNIST, trained as one worker of a Pacer job
from an ordinary training loop.

    pacer-run --workers 3 -- /usr/bin/python3 train_fashion.py --model cnn

Every worker runs this. The one the monitor names evaluates on a side
thread (distribute(..., evaluate=...)) every --eval-interval seconds of the
monitor's, or with --eval-every N inside the loop every N steps, and the
monitor stops the job at its --target-accuracy. --warmup N warms the lr up
over the job's first N steps (a worker that joins later starts at the
job's step: follow_job_step). --slowdown F emulates a straggler: after
each step it sleeps (F - 1) times the step's compute.
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fashion_mnist  # noqa: E402

import pacer.torch as pt  # noqa: E402


def mlp():
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 10))


def cnn():
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 7 * 7, 10))


def evaluate(model, test):
    x, y = test.tensors
    with torch.no_grad():
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y).item()
        accuracy = (logits.argmax(dim=1) == y).float().mean().item()
    return accuracy, loss, len(y)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    ap.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd",
                    help="the shards' optimizer (the first worker's declaration sets the job's)")
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--warmup", type=int, default=0, help="linear lr warm-up over N job steps")
    ap.add_argument("--train-limit", type=int, default=0)
    ap.add_argument("--test-limit", type=int, default=2000)
    ap.add_argument("--eval-every", type=int, default=0,
                    help="evaluate inside the loop every N steps (0: on a side thread)")
    ap.add_argument("--slowdown", type=float, default=1.0)
    ap.add_argument("--sample-log", default="")
    ap.add_argument("--step-log", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)  # one core per worker; the machine is shared
    torch.manual_seed(1)

    pt.init(sample_log=args.sample_log, step_log=args.step_log)
    net = mlp() if args.model == "mlp" else cnn()
    if args.optimizer == "sgd":
        opt = torch.optim.SGD(net.parameters(), lr=args.lr or 0.1, momentum=0.9)
    else:
        opt = torch.optim.AdamW(net.parameters(), lr=args.lr or 1e-3, weight_decay=0.01)
    test = fashion_mnist.load(train=False, limit=args.test_limit)
    side = (lambda m: evaluate(m, test)) if args.eval_every == 0 else None
    model, opt = pt.distribute(net, opt, evaluate=side)
    if args.warmup > 0:
        warmup = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: min(1.0, (step + 1) / args.warmup))
        pt.follow_job_step(warmup)
    train = fashion_mnist.load(train=True, limit=args.train_limit)
    loader = pt.DataLoader(train)
    while not loader.stopped:  # an iteration per epoch of the job, until it stops
        for x, y in loader:
            started = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(model(x), y)  # mean over the batch
            opt.zero_grad()
            loss.backward()
            if args.slowdown > 1.0:
                time.sleep((args.slowdown - 1.0) * (time.perf_counter() - started))
            opt.step(loss=loss)
            if args.warmup > 0:
                warmup.step()
            if args.eval_every and pt.is_evaluator() and loader.step % args.eval_every == 0:
                accuracy, test_loss, samples = evaluate(model, test)
                pt.report(accuracy=accuracy, loss=test_loss, samples=samples)
    result = pt.shutdown()
    print("worker summary: rank=%d clocks=%d samples=%d seconds=%.1f last_batch=%d stop=%s"
          % (pt.rank(), result.get("clocks", 0), result.get("samples", 0),
             result.get("seconds", 0), result.get("last_batch", 0),
             result.get("stop_reason", "")))


if __name__ == "__main__":
    main()
