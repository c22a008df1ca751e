#!/usr/bin/python3
"""What pacer.torch costs per step, against pacer-worker's own overhead.

For the same MLP (784-256-128-10) and the same job (one shard, one worker,
BSP, fixed policy, batch 64), interleaved reps of:

  A  pacer-worker: per step, its period less its compute (the runtime's
     time outside the gradient: pull, push, positions, bookkeeping);
  B  a pacer.torch worker (worker/python/examples/train_fashion.py): its
     period per step;
  C  a plain local torch loop over the same batches: collate the same
     samples, forward, backward, torch.optim.SGD step; its period per step.

The figure is (B - C) / A: what a pacer.torch step takes beyond a plain
local torch step, over what pacer-worker takes beyond its compute. Periods
are medians over each run's steps after the first 20; every rep prints
its figures, and the summary the median and spread of the ratio.

    bench/torch/overhead.py [--build build] [--reps 3] [--seconds 8]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "worker", "python", "examples"))


def steps(path, skip=20):
    """Per-step (period, compute) from a --step-log, the first `skip` dropped."""
    rows = [line.split() for line in open(path)]
    t = [float(r[0]) for r in rows]
    compute = [float(r[3]) for r in rows]
    periods = [b - a for a, b in zip(t, t[1:])]
    return periods[skip:], compute[skip:-1]


def job(build, seconds, worker_cmd, env, tmp, name):
    out = open(os.path.join(tmp, name + "-monitor.out"), "w")
    mon = subprocess.Popen([os.path.join(build, "monitor", "pacer-monitor"), "--listen",
                            "tcp://127.0.0.1:0", "--metrics-addr", "off", "--min-workers", "1",
                            "--min-shards", "1", "--mode", "bsp", "--policy", "fixed",
                            "--global-batch", "64", "--time-cap", str(seconds),
                            "--eval-interval", "1000", "--target-accuracy", "0.999"],
                           stdout=out, stderr=subprocess.DEVNULL)
    address = None
    for _ in range(200):
        m = re.search(r"^listening (\S+)", open(out.name).read(), re.M)
        if m:
            address = m.group(1)
            break
        time.sleep(0.05)
    shard = subprocess.Popen([os.path.join(build, "ps", "pacer-server"), "--listen",
                              "tcp://127.0.0.1:0", "--monitor", address, "--metrics-addr", "off"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    w = subprocess.run(worker_cmd(address), env=dict(os.environ, PACER_MONITOR=address, **env),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=seconds + 60)
    for p in (mon, shard):
        p.terminate()
        p.wait(timeout=30)
    if w.returncode != 0:
        raise RuntimeError("%s: worker exited %d" % (name, w.returncode))


def local_torch(seconds, batch=64):
    import torch
    import fashion_mnist
    torch.set_num_threads(1)
    torch.manual_seed(1)
    train = fashion_mnist.load(train=True)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    order = torch.randperm(len(train))
    collate = torch.utils.data.default_collate
    marks, i = [], 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        marks.append(time.perf_counter())
        idx = order[i:i + batch]
        i = (i + batch) % (len(train) - batch)
        x, y = collate([train[int(j)] for j in idx])
        loss = torch.nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    periods = [b - a for a, b in zip(marks, marks[1:])]
    return periods[20:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=8)
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    env = {"PYTHONPATH": os.path.join(build, "python")}
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            a_log = os.path.join(tmp, "a%d.log" % rep)
            job(build, args.seconds,
                lambda m: [os.path.join(build, "worker", "pacer-worker"), "--monitor", m,
                           "--progress", "plain", "--device", "cpu", "--step-log", a_log],
                {}, tmp, "a%d" % rep)
            b_log = os.path.join(tmp, "b%d.log" % rep)
            job(build, args.seconds,
                lambda m: ["/usr/bin/python3", os.path.join(ROOT, "worker", "python", "examples",
                                                            "train_fashion.py"),
                           "--model", "mlp", "--eval-every", "1000000000", "--step-log", b_log],
                env, tmp, "b%d" % rep)
            c = statistics.median(local_torch(args.seconds))
            a_periods, a_compute = steps(a_log)
            a = statistics.median(p - q for p, q in zip(a_periods, a_compute))
            b_periods, _ = steps(b_log)
            b = statistics.median(b_periods)
            ratio = (b - c) / a
            ratios.append(ratio)
            print("rep %d: pacer-worker outside compute %.3f ms (period %.3f ms); pacer.torch "
                  "period %.3f ms; local torch %.3f ms; pacer.torch beyond local %.3f ms; "
                  "ratio %.2f" % (rep + 1, a * 1e3, statistics.median(a_periods) * 1e3, b * 1e3,
                                  c * 1e3, (b - c) * 1e3, ratio), flush=True)
    print("ratio (pacer.torch beyond local torch) / (pacer-worker outside compute): median %.2f, "
          "range %.2f-%.2f over %d reps (target <= 1.15)"
          % (statistics.median(ratios), min(ratios), max(ratios), len(ratios)))


if __name__ == "__main__":
    main()
