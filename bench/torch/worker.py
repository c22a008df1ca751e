#!/usr/bin/python3
"""One worker of bench/torch/versus_ddp.py: the same CNN, data, optimizer
and loop body under PyTorch DDP (gloo) or pacer.torch.

    worker.py --system ddp --rank R --world 3 --init tcp://127.0.0.1:PORT ...
    PACER_MONITOR=tcp://... worker.py --system pacer ...

Every step: forward, mean cross-entropy, backward; the straggler (the last
rank, under --straggler F > 1) then sleeps (F - 1) times that step's
forward+backward time, the same in-loop emulation for both systems; then
the optimizer's step (DDP: the torch optimizer on the all-reduced
gradient; pacer.torch: the push; --optimizer: AdamW or SGD with momentum). The evaluating worker (rank 0; pacer: the one the
monitor names) copies its weights every --snapshot-every seconds, with the
time since its first step and its step count, into --snapshots: the driver
evaluates them afterwards, off the clock, so that no run pays for its own
evaluation. Training ends after --seconds (DDP: the ranks agree every 10
steps; pacer: the monitor's --time-cap).
"""

import argparse
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


def body(model, x, y, straggle):
    """Forward, loss, backward, and the straggler's sleep: the loop body
    both systems share."""
    started = time.perf_counter()
    loss = F.cross_entropy(model(x), y)  # mean over the batch
    loss.backward()
    if straggle > 1.0:
        time.sleep((straggle - 1.0) * (time.perf_counter() - started))
    return loss


def run_ddp(args, snaps):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler
    dist.init_process_group("gloo", init_method=args.init, rank=args.rank,
                            world_size=args.world)
    net = cnn()
    model = DistributedDataParallel(net)
    opt = make_optimizer(args.optimizer, args.lr, model.parameters())
    train = fashion_mnist.load(train=True)
    sampler = DistributedSampler(train, num_replicas=args.world, rank=args.rank, shuffle=True,
                                 seed=1)
    loader = DataLoader(train, batch_size=BATCH, sampler=sampler, drop_last=True)
    straggle = args.straggler if args.rank == args.world - 1 else 1.0
    dist.barrier()
    snaps.start()
    steps, epoch, stop = 0, 0, torch.zeros(1)
    while True:
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            body(model, x, y, straggle)
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


def run_pacer(args, snaps):
    import pacer.torch as pt
    pt.init()
    net = cnn()
    model, opt = pt.distribute(net, make_optimizer(args.optimizer, args.lr, net.parameters()))
    train = fashion_mnist.load(train=True)
    loader = pt.DataLoader(train)
    straggle = None
    steps = 0
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
    ap.add_argument("--snapshot-every", type=float, default=1.0)
    ap.add_argument("--snapshots", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)  # one core's worth per worker, for every system
    torch.manual_seed(1)      # the same initial weights everywhere
    snaps = Snapshots(args.snapshots, args.snapshot_every)
    (run_ddp if args.system == "ddp" else run_pacer)(args, snaps)


if __name__ == "__main__":
    main()
