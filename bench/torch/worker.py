#!/usr/bin/python3
"""One worker of bench/torch/versus_ddp.py: the same CNN, data, optimizer
and loop body under PyTorch DDP (gloo) or pacer.torch.

    worker.py --system ddp --rank R --world 3 --init tcp://127.0.0.1:PORT ...
    PACER_MONITOR=tcp://... worker.py --system pacer ...

Every step: forward, mean cross-entropy, backward; the straggler (the last
rank, under --straggler F > 1) then sleeps (F - 1) times its
forward+backward time: under pacer.torch that step's, timed in the loop
(its backward does no communication; its batch is the policy's); under DDP,
whose backward holds the all-reduce (a wait on the others that would feed
back into the sleep), the median of 20 forward+backward passes of a copy
of the model on a batch of 64 timed before training, with every rank doing
the same at once as they will in training; then
the optimizer's step (DDP: the torch optimizer on the all-reduced
gradient; pacer.torch: the push; --optimizer: AdamW or SGD with momentum). The evaluating worker (rank 0; pacer: the one the
monitor names) copies its weights every --snapshot-every seconds, with the
time since its first step and its step count, into --snapshots: the driver
evaluates them afterwards, off the clock, so that no run pays for its own
evaluation. Training ends after --seconds (DDP: the ranks agree every 10
steps; pacer: the monitor's --time-cap), or with --epochs E after E
epochs over the training set (DDP: DistributedSampler's epochs; pacer:
the monitor's --data-stream --epochs E, one loader iteration per epoch).
--sorted sorts the training set by label (ordered data); --label-log
writes, per trained batch, its time, epoch (pacer's data stream: the
loader's; otherwise none) and its count of each label.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "worker", "python", "examples"))
import fashion_mnist  # noqa: E402
from train_fashion import cnn  # noqa: E402  (the example's CNN: one definition)

BATCH = 64  # per worker; 3 workers: pacer's --global-batch 192


def make_optimizer(kind, lr, params):
    """The same torch optimizer under both systems (pacer: the shards run it)."""
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr or 0.05, momentum=0.9)
    return torch.optim.AdamW(params, lr=lr or 1e-3, weight_decay=0.01)


def training_set(sorted_by_label):
    train = fashion_mnist.load(train=True)
    if sorted_by_label:
        x, y = train.tensors
        order = torch.sort(y, stable=True).indices
        train = torch.utils.data.TensorDataset(x[order], y[order])
    return train


class LabelLog:
    """Per trained batch: wall time, epoch (or None), count of each label."""

    def __init__(self, path):
        self.path, self.rows = path, []

    def add(self, y, epoch=None):
        if self.path:
            self.rows.append({"t": time.time(), "e": epoch,
                              "n": torch.bincount(y, minlength=10).tolist()})

    def save(self):
        if self.path:
            with open(self.path, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in self.rows)


class Snapshots:
    def __init__(self, path, every):
        self.path, self.every = path, every
        self.rows = []  # (seconds since the first step, steps, {name: tensor})
        self.t0 = None
        self.next = 0.0

    def start(self):
        self.t0 = time.perf_counter()

    def maybe(self, model, steps, force=False):
        t = time.perf_counter() - self.t0
        if force or t >= self.next:
            self.rows.append((t, steps, {k: v.detach().clone() for k, v in
                                         model.state_dict().items()}))
            self.next = t + self.every

    def save(self):
        torch.save(self.rows, self.path)


def body(model, x, y, straggle, compute=None):
    """Forward, loss, backward, and the straggler's sleep: (straggle - 1)
    times `compute` (seconds), or else the forward+backward just timed.
    The loop body both systems share."""
    started = time.perf_counter()
    loss = F.cross_entropy(model(x), y)  # mean over the batch
    loss.backward()
    if straggle > 1.0:
        took = compute if compute is not None else time.perf_counter() - started
        time.sleep((straggle - 1.0) * took)
    return loss


def calibrate(net, x, y, passes=20):
    """Median seconds of a forward+backward of a copy of `net` on (x, y),
    with no communication."""
    import copy
    import statistics
    twin = copy.deepcopy(net)
    times = []
    for _ in range(passes):
        started = time.perf_counter()
        F.cross_entropy(twin(x), y).backward()
        times.append(time.perf_counter() - started)
        twin.zero_grad()
    return statistics.median(times)


def run_ddp(args, snaps, labels):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler
    dist.init_process_group("gloo", init_method=args.init, rank=args.rank,
                            world_size=args.world)
    net = cnn()
    train = training_set(args.sorted)
    # Every rank times the same passes at once (the contention of training).
    compute = calibrate(net, *train[torch.arange(BATCH)])
    print("rank %d: forward+backward of %d: %.1f ms" % (args.rank, BATCH, compute * 1e3),
          file=sys.stderr, flush=True)
    model = DistributedDataParallel(net)
    opt = make_optimizer(args.optimizer, args.lr, model.parameters())
    sampler = DistributedSampler(train, num_replicas=args.world, rank=args.rank, shuffle=True,
                                 seed=1)
    loader = DataLoader(train, batch_size=BATCH, sampler=sampler, drop_last=True)
    straggle = args.straggler if args.rank == args.world - 1 else 1.0
    dist.barrier()
    snaps.start()
    steps, epoch, stop = 0, 0, torch.zeros(1)
    while args.epochs:
        # Epoch-bounded: DistributedSampler's static cut, every rank its
        # third of each epoch.
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            body(model, x, y, straggle, compute)
            opt.step()
            steps += 1
            labels.add(y)
            if args.rank == 0:
                snaps.maybe(net, steps)
        epoch += 1
        if epoch == args.epochs:
            break
    while not args.epochs:
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            body(model, x, y, straggle, compute)
            opt.step()
            steps += 1
            if args.rank == 0:
                snaps.maybe(net, steps)
            if steps % 10 == 0:
                # Every rank leaves at the same step: "time is up" from any.
                stop.fill_(1.0 if time.perf_counter() - snaps.t0 >= args.seconds else 0.0)
                dist.all_reduce(stop, op=dist.ReduceOp.MAX)
                if stop.item() > 0:
                    break
        else:
            epoch += 1
            continue
        break
    if args.rank == 0:
        snaps.maybe(net, steps, force=True)
        snaps.save()
    dist.destroy_process_group()


def run_pacer(args, snaps, labels):
    import pacer.torch as pt
    pt.init()
    net = cnn()
    model, opt = pt.distribute(net, make_optimizer(args.optimizer, args.lr, net.parameters()))
    train = training_set(args.sorted)
    loader = pt.DataLoader(train)
    straggle = None
    steps = 0
    def epochs():
        # One loader iteration per epoch of the job: E of them, or (bound
        # by time) until the job stops.
        if args.epochs:
            yield from range(args.epochs)
        while not args.epochs and not loader.stopped:
            yield

    for _ in epochs():
        for x, y in loader:
            if straggle is None:
                # Ranks follow registration; the straggler is the last, never
                # the evaluator (the lowest live rank), as under DDP.
                straggle = args.straggler if pt.rank() == args.world - 1 else 1.0
                if pt.is_evaluator():
                    snaps.start()
            opt.zero_grad()
            loss = body(model, x, y, straggle)
            opt.step(loss=loss)
            steps += 1
            labels.add(y, loader.epoch)
            if snaps.t0 is not None:
                snaps.maybe(net, steps)
    if snaps.t0 is not None:
        snaps.maybe(net, steps, force=True)
        snaps.save()
    pt.shutdown()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--system", choices=["ddp", "pacer"], required=True)
    ap.add_argument("--rank", type=int, default=0, help="ddp: this process's rank")
    ap.add_argument("--world", type=int, default=3)
    ap.add_argument("--init", default="", help="ddp: tcp://127.0.0.1:PORT")
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--straggler", type=float, default=1.0)
    ap.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd",
                    help="sgd: momentum 0.9; adamw: weight decay 0.01")
    ap.add_argument("--lr", type=float, default=0.0, help="default: sgd 0.05, adamw 1e-3")
    ap.add_argument("--epochs", type=int, default=0,
                    help="train this many epochs over the training set (0: --seconds)")
    ap.add_argument("--sorted", action="store_true", help="the training set sorted by label")
    ap.add_argument("--label-log", default="", help="per batch: time, epoch, label counts")
    ap.add_argument("--snapshot-every", type=float, default=1.0)
    ap.add_argument("--snapshots", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)  # one core's worth per worker, for every system
    torch.manual_seed(1)      # the same initial weights everywhere
    snaps = Snapshots(args.snapshots, args.snapshot_every)
    labels = LabelLog(args.label_log)
    (run_ddp if args.system == "ddp" else run_pacer)(args, snaps, labels)
    labels.save()


if __name__ == "__main__":
    main()
