"""Mode local (pacer-monitor --mode local): rounds of local steps. Two
workers of different speeds train with their own torch optimizers; the
shards combine each round's changes, weighted by the samples each worker
trained, and step the outer optimizer (SGD with Nesterov momentum). The
weights after three rounds equal, to 1e-5, those that plain torch computes
from the workers' own records of their local steps."""

import os

import numpy as np
import pytest
import torch

import local_worker as lw

ROUNDS = 3


def read_record(path):
    steps, weights = [], None
    with open(path) as f:
        for line in f:
            kind, *rest = line.split()
            if kind == "step":
                steps.append((int(rest[0]), [int(i) for i in rest[1:]]))
            elif kind == "weights":
                weights = torch.tensor([float(v) for v in rest])
    return steps, weights


def reference(records, inner):
    """The rounds as plain torch computes them from each worker's steps:
    each worker's own model and optimizer (its state kept across rounds)
    starts a round at the shards' weights; the round's change, start minus
    end, is averaged weighted by samples and given to the outer optimizer
    as its gradient."""
    dataset = lw.data()
    shared = lw.net()
    outer = lw.outer_optimizer(shared.parameters())
    workers = []
    for _ in records:
        m = lw.net()
        workers.append((m, lw.inner_optimizer(inner, m.parameters())))
    for r in range(ROUNDS):
        start = [p.detach().clone() for p in shared.parameters()]
        changes, samples = [], []
        for (m, opt), steps in zip(workers, records):
            with torch.no_grad():
                for p, s in zip(m.parameters(), start):
                    p.copy_(s)
            n = 0
            for step, idx in steps:
                if step != r:
                    continue
                x, y = dataset[torch.tensor(idx)]
                loss = torch.nn.functional.cross_entropy(m(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                n += len(idx)
            changes.append([s - p.detach() for s, p in zip(start, m.parameters())])
            samples.append(n)
        total = float(sum(samples))
        for i, p in enumerate(shared.parameters()):
            p.grad = sum(b * c[i] for b, c in zip(samples, changes)) / total
        outer.step()
    return torch.cat([p.detach().reshape(-1) for p in shared.parameters()]), samples


@pytest.mark.parametrize("inner", ["sgd", "rmsprop"])
def test_rounds_match_plain_torch(job, inner):
    job.run(shards=2, monitor_args=["--min-workers", "2", "--mode", "local",
                                    "--round-seconds", "0.4", "--policy", "fixed",
                                    "--global-batch", "32", "--time-cap", "60",
                                    "--chunk-samples", "256"])
    outs = [os.path.join(job.dir, "w%d.txt" % i) for i in range(2)]
    procs = [job.worker("w%d" % i, "local_worker.py", "--inner", inner, "--sleep", sleep,
                        "--rounds", ROUNDS, "--out", outs[i])
             for i, sleep in enumerate([0.01, 0.04])]
    for i, p in enumerate(procs):
        assert p.wait(timeout=60) == 0, job.log("w%d" % i)[-3000:]
    records = [read_record(o) for o in outs]
    weights = records[0][1]
    assert weights is not None and torch.equal(weights, records[1][1]), \
        "the workers pulled different weights after the last round"
    steps = [r[0] for r in records]
    per_round = [[sum(len(i) for s, i in st if s == r) for st in steps] for r in range(ROUNDS)]
    # The slower worker trained fewer samples in each round: the weighting
    # matters.
    assert all(a > b > 0 for a, b in per_round), per_round
    expected, _ = reference(steps, inner)
    start = torch.cat([p.detach().reshape(-1) for p in lw.net().parameters()])
    assert (expected - start).abs().max().item() > 1e-2, "the weights hardly moved"
    worst = (weights - expected).abs().max().item()
    assert worst <= 1e-5, "the shards' rounds differ from torch's by %g" % worst


def test_an_outer_optimizer_in_a_job_of_another_mode_is_refused(job):
    import pacer.torch as pt
    job.run(shards=1, monitor_args=["--min-workers", "1", "--mode", "bsp", "--time-cap", "60"])
    pt.init(job.monitor, handle_sigterm=False)
    model = lw.net()
    model, opt = pt.distribute(model, torch.optim.RMSprop(model.parameters()),
                               outer=lw.outer_optimizer(model.parameters()))
    with pytest.raises(ValueError, match="job runs mode bsp: start pacer-monitor with --mode local"):
        next(iter(pt.DataLoader(lw.data())))
    pt.shutdown()
