#!/usr/bin/python3
"""pacer.torch against PyTorch DDP: the same CNN, data and loop, 3 workers.

Three systems, each with no straggler and with one 4x compute straggler
(the last rank sleeps 3x its forward+backward in its own loop, the same
emulation for all; bench/torch/worker.py):

  ddp        torch.nn.parallel.DistributedDataParallel over gloo,
             DistributedSampler, the torch optimizer of --optimizer/--lr
             (default SGD, lr 0.05, momentum 0.9), 64 samples per worker
             and step;
  pacer-bsp  pacer.torch, 2 shards, BSP with the fixed policy (64 each);
  pacer      pacer.torch, 2 shards, the default pacer policy (batch sizes
             from measured speed, DSSP), global batch 192.

Reps are interleaved (rep 1: every system and scenario, then rep 2, ...;
the systems' order rotates per rep). Each run trains for --seconds
(--straggler-seconds with the straggler), then stops. The evaluating worker copies its weights every --snapshot-every s;
afterwards, off the clock, this script evaluates them on the first
--test-limit test images: the time to --target accuracy (the first
snapshot, every one scored, with at least ceil(target x images) right, in
seconds since the evaluator's first step), its step count there, and the
accuracy of the last snapshot (after --seconds). Ratios are pacer's time
over DDP's in the same rep and scenario; where DDP does not reach the
target within the run, the ratio is an upper bound (pacer's time over the
run's length), marked "<"; where pacer does not, a lower bound, ">".
--keep-snapshots keeps the weights (runs/*/snapshots*.pt) for rescoring.

Writes DIR/runs.csv, DIR/curves.csv, DIR/summary.md and DIR/accuracy.png
(gnuplot); with --results also the section in bench/RESULTS.md.

Epochs mode (--epochs E): each run trains E epochs over the training set
instead of a time: DDP with DistributedSampler (a static third of each
epoch per rank), pacer with the monitor's --data-stream --epochs E (one
loader iteration per epoch). It reports each run's time for the E epochs
(the evaluator's, first step to the end of its loop) and the accuracy
after them on the whole test set, and adds the scenario "ordered": the
4x straggler on a training set sorted by label, with "pacer-partitions"
(the per-worker partitions, --data-partitions 3, capped at
--partitions-seconds) beside. Every worker logs each batch's labels; the
report gives, per run, how far each class's share of the samples trained
in each epoch, and in each tenth of one, strays from its share of the
data set (percentage points, the largest over classes and epochs).

    bench/torch/versus_ddp.py [--reps 3] [--seconds 60] [--straggler-seconds 100]
                              [--out DIR] [--results]
    bench/torch/versus_ddp.py --epochs 3 [--reps 3] [--out DIR] [--results]
    bench/torch/versus_ddp.py --report-only [--epochs 3] [--out DIR] [--results]
"""

import argparse
import csv
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "worker", "python", "examples"))

SYSTEMS = ["ddp", "pacer-bsp", "pacer"]
SCENARIOS = {"none": 1.0, "straggler": 4.0, "ordered": 4.0}
SORTED = {"ordered"}  # scenarios on the training set sorted by label
# pacer-adaptive (not run by default): adaptive batch sizes over BSP, the
# pacer policy without DSSP.
PACER_MODES = {"pacer-bsp": ["--mode", "bsp", "--policy", "fixed"], "pacer": [],
               "pacer-adaptive": ["--policy", "adaptive-batch"], "pacer-partitions": []}
# Epochs mode: the systems that read the data stream (the others read
# per-worker partitions, --data-partitions 3).
STREAM = {"pacer", "pacer-bsp", "pacer-adaptive"}
WORLD = 3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_address(path, timeout=15.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = re.search(r"^listening (tcp://\S+)", open(path).read(), re.M)
        if m:
            return m.group(1)
        time.sleep(0.05)
    raise RuntimeError("%s: no address" % path)


def stop_all(procs):
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def seconds(args, scenario, system=""):
    if args.epochs:  # a bound that only a hung run meets
        return args.partitions_seconds if system == "pacer-partitions" else args.epochs_cap
    return args.seconds if scenario == "none" else args.straggler_seconds


def run_one(args, run_dir, system, scenario):
    """Runs one job; the evaluator's snapshot file."""
    os.makedirs(run_dir, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.path.join(args.build, "python"))
    straggler, cap = SCENARIOS[scenario], seconds(args, scenario, system)
    worker = ["/usr/bin/python3", os.path.join(HERE, "worker.py"), "--seconds", str(cap),
              "--optimizer", args.optimizer, "--lr", str(args.lr),
              "--straggler", str(straggler), "--snapshot-every", str(args.snapshot_every),
              "--world", str(WORLD)]
    if args.epochs:
        worker += ["--epochs", str(args.epochs)]
    if scenario in SORTED:
        worker += ["--sorted"]
    mode = list(PACER_MODES.get(system, []))
    if args.epochs:
        mode += (["--data-stream"] if system in STREAM else ["--data-partitions", str(WORLD)]) \
            + ["--epochs", str(args.epochs)]
    procs, workers = [], []

    def start(name, cmd, e=None):
        p = subprocess.Popen(cmd, stdout=open(os.path.join(run_dir, name + ".out"), "w"),
                             stderr=open(os.path.join(run_dir, name + ".log"), "w"),
                             stdin=subprocess.DEVNULL, env=e)
        procs.append(p)
        return p

    try:
        if system == "ddp":
            init = "tcp://127.0.0.1:%d" % free_port()
            for r in range(WORLD):
                workers.append(start("worker%d" % r, worker + [
                    "--system", "ddp", "--rank", str(r), "--init", init,
                    "--label-log", os.path.join(run_dir, "labels%d.jsonl" % r),
                    "--snapshots", os.path.join(run_dir, "snapshots%d.pt" % r)], env))
        else:
            start("monitor", [os.path.join(args.build, "monitor", "pacer-monitor"), "--listen",
                              "tcp://127.0.0.1:0", "--metrics-addr", "off", "--min-workers",
                              str(WORLD), "--min-shards", "2", "--global-batch", str(64 * WORLD),
                              "--time-cap", str(cap), "--optimizer", args.optimizer, *mode])
            monitor = wait_address(os.path.join(run_dir, "monitor.out"))
            for i in range(2):
                start("shard%d" % i, [os.path.join(args.build, "ps", "pacer-server"), "--listen",
                                      "tcp://127.0.0.1:0", "--monitor", monitor,
                                      "--metrics-addr", "off"])
            for r in range(WORLD):
                workers.append(start("worker%d" % r, worker + [
                    "--system", "pacer", "--snapshots",
                    os.path.join(run_dir, "snapshots%d.pt" % r),
                    "--label-log", os.path.join(run_dir, "labels%d.jsonl" % r)],
                    dict(env, PACER_MONITOR=monitor)))
        deadline = time.time() + cap + 120
        for i, w in enumerate(workers):
            rc = w.wait(timeout=max(1.0, deadline - time.time()))
            if rc != 0:
                raise RuntimeError("%s worker%d exited %d; see %s" % (system, i, rc, run_dir))
    finally:
        stop_all(procs)
    found = [os.path.join(run_dir, "snapshots%d.pt" % r) for r in range(WORLD)]
    found = [f for f in found if os.path.exists(f)]
    if len(found) != 1:
        raise RuntimeError("%s: %d evaluators' snapshots in %s" % (system, len(found), run_dir))
    return found[0]


class Evaluator:
    def __init__(self, test_limit):
        import fashion_mnist
        from train_fashion import cnn
        self.x, self.y = fashion_mnist.load(train=False, limit=test_limit).tensors
        self.net = cnn()

    def correct(self, state):
        self.net.load_state_dict(state)
        with torch.no_grad():
            return int((self.net(self.x).argmax(dim=1) == self.y).sum().item())


def evaluate(ev, path, target, every):
    """(time to target or None, steps there, final seconds, final steps,
    final accuracy, [(t, steps, accuracy)] evaluated). Every snapshot in
    order until the first with ceil(target x images) right (counted, not
    a rounded float: 4400 of 5000 is 0.88); then every `every`th for the
    plot, and the last."""
    rows = torch.load(path)
    n = len(ev.y)
    need = math.ceil(target * n - 1e-9) if target is not None else 0
    right = {}

    def at(i):
        if i not in right:
            right[i] = ev.correct(rows[i][2])
        return right[i]

    hit = None
    for i in range(len(rows) if target is not None else 0):  # None: no target
        if at(i) >= need:
            hit = i
            break
    at(len(rows) - 1)
    for i in range(0, len(rows), every):
        at(i)
    curve = [(rows[i][0], rows[i][1], right[i] / n) for i in sorted(right)]
    t, steps, final = curve[-1]
    return (rows[hit][0] if hit is not None else None, rows[hit][1] if hit is not None else None,
            t, steps, final, curve)


def class_shares(run_dir, share, n):
    """How far each class's share of the trained samples strays from its
    share of the data set `share` (a list of 10 fractions): (epochs
    covered, the largest deviation over classes and epochs, the largest
    over classes and tenths of an epoch, the median over tenths of each
    tenth's largest), in percentage points. The workers' batches in time
    order; an epoch is the loader's (data stream) or else each n samples
    trained in turn; a tenth is each n/10 samples of an epoch in time order.
    Epochs with fewer than 0.9 n samples (a capped run's last) are left
    out."""
    rows = []
    for name in os.listdir(run_dir):
        if name.startswith("labels") and name.endswith(".jsonl"):
            rows += [json.loads(line) for line in open(os.path.join(run_dir, name))]
    rows.sort(key=lambda r: r["t"])
    return _shares(rows, share, n)


def _shares(rows, share, n):
    tagged = rows and all(r["e"] is not None for r in rows)
    epochs, done = {}, 0
    for r in rows:
        e = r["e"] if tagged else done // n
        epochs.setdefault(e, []).append(r["n"])
        done += sum(r["n"])
    per_epoch, per_tenth = [], []
    for e in sorted(epochs):
        batches = epochs[e]
        total = sum(sum(b) for b in batches)
        if total < 0.9 * n:
            continue
        counts = [sum(b[c] for b in batches) for c in range(10)]
        per_epoch.append(max(abs(counts[c] / total - share[c]) for c in range(10)) * 100)
        tenths, seen = [[0] * 10 for _ in range(10)], 0
        for b in batches:
            t = min(9, seen * 10 // n)
            for c in range(10):
                tenths[t][c] += b[c]
            seen += sum(b)
        for t in tenths:
            if sum(t):
                per_tenth.append(max(abs(t[c] / sum(t) - share[c]) for c in range(10)) * 100)
    if not per_epoch:
        return 0, None, None, None
    return (len(per_epoch), max(per_epoch), max(per_tenth), statistics.median(per_tenth))


def shuffle_reference(epochs, draws=20):
    """class_shares' figures for `epochs` epochs of a uniformly random order
    of the training set, in batches of 192, for `draws` seeds."""
    import fashion_mnist
    labels = fashion_mnist.load(train=True).tensors[1]
    counts = torch.bincount(labels, minlength=10)
    share, n = (counts.double() / counts.sum()).tolist(), len(labels)
    out = []
    for seed in range(draws):
        g = torch.Generator().manual_seed(seed)
        rows = []
        for e in range(epochs):
            order = labels[torch.randperm(n, generator=g)]
            rows += [{"e": e, "n": torch.bincount(order[i:i + 192], minlength=10).tolist()}
                     for i in range(0, n, 192)]
        out.append(_shares(rows, share, n))
    return out


def fmt_spread(values, unit="", digits=1):
    if not values:
        return "–"
    med = statistics.median(values)
    f = "%%.%df" % digits
    if len(values) == 1:
        return (f + unit) % med
    return (f + unit + " (" + f + "–" + f + ")") % (med, min(values), max(values))


def summarise(args):
    runs = list(csv.DictReader(open(os.path.join(args.out, "runs.csv"))))
    meta_path = os.path.join(args.out, "meta.json")
    meta = json.load(open(meta_path)) if os.path.exists(meta_path) else {}
    lines = ["Command: `bench/torch/versus_ddp.py %s` (%s; %s, lr %s)." % (
                 meta.get("command", "?"), meta.get("when", "?"), args.optimizer,
                 args.lr or ("0.05, momentum 0.9" if args.optimizer == "sgd" else "1e-3")),
             "Medians over reps, with the range in parentheses: time and steps (the evaluating "
             "worker's) to %.2f test accuracy (first %d test images), the accuracy at the end of "
             "the run (%g s without a straggler, %g s with one), and pacer's time over DDP's in "
             "the same rep." % (args.target, args.test_limit, args.seconds,
                                args.straggler_seconds), ""]
    lines.append("| scenario | system | reached in | time to %.2f | steps to %.2f | accuracy "
                 "at the end | time / DDP's |" % (args.target, args.target))
    lines.append("|---|---|---:|---:|---:|---:|---:|")
    verdict = []
    systems = [s for s in SYSTEMS + list(PACER_MODES) if any(r["system"] == s for r in runs)]
    systems = list(dict.fromkeys(systems))
    for scenario in [sc for sc in SCENARIOS if any(r["scenario"] == sc for r in runs)]:
        ddp = {r["rep"]: r for r in runs if r["scenario"] == scenario and r["system"] == "ddp"}
        for system in systems:
            mine = [r for r in runs if r["scenario"] == scenario and r["system"] == system]
            reached = [r for r in mine if r["time_to_target"]]
            times = [float(r["time_to_target"]) for r in reached]
            steps = [float(r["steps_to_target"]) for r in reached]
            finals = [float(r["final_accuracy"]) for r in mine]
            ratios, bound = [], ""
            if system != "ddp":
                for r in mine:
                    d = ddp.get(r["rep"])
                    if d is None:
                        continue
                    if r["time_to_target"] and d["time_to_target"]:
                        ratios.append(float(r["time_to_target"]) / float(d["time_to_target"]))
                    elif r["time_to_target"]:
                        bound += "<"  # DDP never reached it: at most this
                        ratios.append(float(r["time_to_target"]) / float(d["final_seconds"]))
                    elif d["time_to_target"]:
                        bound += ">"  # this one never reached it: at least this
                        ratios.append(float(r["final_seconds"]) / float(d["time_to_target"]))
            if "<" in bound and ">" in bound:
                bound = "~"  # bounds both ways: the median means little
            ratio = (bound[:1] + fmt_spread(ratios, digits=2)) if ratios else "–"
            lines.append("| %s | %s | %d of %d | %s | %s | %s | %s |" % (
                scenario, system, len(reached), len(mine), fmt_spread(times, " s"),
                fmt_spread(steps, digits=0), fmt_spread(finals, digits=3),
                "1" if system == "ddp" else ratio))
            if system == "pacer" and ratios:
                goal = 1.1 if scenario == "none" else 0.6
                verdict.append("%s: pacer policy at %s of DDP's time (target at most %.1f)"
                               % (scenario, ratio, goal))
    lines += ["", "; ".join(verdict) + "." if verdict else "(No pacer policy run beside DDP.)",
              "", "Per run:", "",
              "| rep | scenario | system | time to %.2f | steps | accuracy at the end | "
              "steps in the run |" % args.target, "|---:|---|---|---:|---:|---:|---:|"]
    for r in runs:
        lines.append("| %s | %s | %s | %s | %s | %.3f | %s |" % (
            r["rep"], r["scenario"], r["system"],
            ("%.1f s" % float(r["time_to_target"])) if r["time_to_target"] else "not reached",
            r["steps_to_target"] or "–", float(r["final_accuracy"]), r["final_steps"]))
    text = ("<!-- torch-ddp:begin (bench/torch/versus_ddp.py writes this section) -->\n"
            + "\n".join(lines) + "\n\n![accuracy over time](%s)\n"
            % os.path.relpath(os.path.join(args.out, "accuracy.png"), os.path.join(ROOT, "bench"))
            + "<!-- torch-ddp:end -->\n")
    open(os.path.join(args.out, "summary.md"), "w").write(text)
    return text


def summarise_epochs(args):
    runs = list(csv.DictReader(open(os.path.join(args.out, "runs.csv"))))
    meta_path = os.path.join(args.out, "meta.json")
    meta = json.load(open(meta_path)) if os.path.exists(meta_path) else {}
    reps = max(int(r["rep"]) for r in runs)
    lines = ["Command: `bench/torch/versus_ddp.py %s` (%s; %s, lr %s; %d interleaved reps; "
             "nothing else ran)." % (
                 meta.get("command", "?"), meta.get("when", "?"), args.optimizer,
                 args.lr or ("0.05, momentum 0.9" if args.optimizer == "sgd" else "1e-3"), reps),
             "%d epochs of the Fashion-MNIST training set, 3 workers (one core's thread each), "
             "64 samples per worker and step (pacer: global batch 192). DDP reads with "
             "DistributedSampler; pacer with the monitor's data stream (`--data-stream --epochs "
             "%d`). Medians over reps, range in parentheses: the time for the epochs (the "
             "evaluating worker's, first step to the end of its loop), the test accuracy after "
             "them (all %d test images), and pacer's time over DDP's and its accuracy minus "
             "DDP's (points) in the same rep." % (args.epochs, args.epochs, args.test_limit), "",
             "| scenario | system | time for %d epochs | accuracy after | time / DDP's | "
             "accuracy − DDP's (points) |" % args.epochs, "|---|---|---:|---:|---:|---:|"]
    verdict = []
    for scenario in [sc for sc in SCENARIOS if any(r["scenario"] == sc for r in runs)]:
        ddp = {r["rep"]: r for r in runs if r["scenario"] == scenario and r["system"] == "ddp"}
        for system in dict.fromkeys(r["system"] for r in runs if r["scenario"] == scenario):
            mine = [r for r in runs if r["scenario"] == scenario and r["system"] == system]
            times = [float(r["final_seconds"]) for r in mine]
            accs = [float(r["final_accuracy"]) for r in mine]
            ratios = [float(r["final_seconds"]) / float(ddp[r["rep"]]["final_seconds"])
                      for r in mine if r["rep"] in ddp]
            gaps = [100 * (float(r["final_accuracy"]) - float(ddp[r["rep"]]["final_accuracy"]))
                    for r in mine if r["rep"] in ddp]
            capped = system == "pacer-partitions"
            lines.append("| %s | %s | %s | %s | %s | %s |" % (
                scenario, system,
                ("capped at %g s" % args.partitions_seconds) if capped else fmt_spread(times, " s"),
                fmt_spread(accs, digits=3), "1" if system == "ddp" else
                ("–" if capped else fmt_spread(ratios, digits=2)),
                "0" if system == "ddp" else ("–" if capped else fmt_spread(gaps, digits=2))))
            if system == "pacer" and ratios and scenario != "ordered":
                goal = 1.1 if scenario == "none" else 0.6
                verdict.append("%s: pacer at %s of DDP's time (target at most %.1f), accuracy "
                               "%s points from DDP's (target within 0.5)" % (
                                   scenario, fmt_spread(ratios, digits=2), goal,
                                   fmt_spread(gaps, digits=2)))
    lines += ["", "; ".join(verdict) + "." if verdict else "", ""]
    ordered = [r for r in runs if r["scenario"] == "ordered" and r["epochs_covered"]]
    if ordered:
        ref = shuffle_reference(args.epochs)
        lines += ["Ordered data (the training set sorted by label, the 4x straggler): how far a "
                  "class's share of the samples trained strays from its share of the data set "
                  "(10%% each), in points, the largest over the 10 classes; per epoch (the "
                  "loader's epoch under the data stream, else each 60,000 samples trained in "
                  "turn) and per tenth of an epoch (6,000 samples in time order). "
                  "pacer-partitions is the layout before the data stream, `--data-partitions "
                  "3` (capped at %g s: the epochs it completed). Medians over reps, range in parentheses. The last "
                  "row is no run: the same measure of %d epochs of a uniformly random order "
                  "(a fresh permutation per epoch, batches of 192; what DDP's "
                  "DistributedSampler reads), over %d draws: the sampling noise of any "
                  "shuffle." % (args.partitions_seconds, args.epochs, len(ref)), "",
                  "| system | epochs measured | largest per epoch | largest per tenth | "
                  "median tenth's largest |", "|---|---:|---:|---:|---:|"]
        for system in dict.fromkeys(r["system"] for r in ordered):
            mine = [r for r in ordered if r["system"] == system]
            lines.append("| %s | %s | %s | %s | %s |" % (
                system, fmt_spread([float(r["epochs_covered"]) for r in mine], digits=0),
                fmt_spread([float(r["epoch_dev"]) for r in mine], digits=2),
                fmt_spread([float(r["tenth_dev"]) for r in mine], digits=2),
                fmt_spread([float(r["tenth_dev_median"]) for r in mine], digits=2)))
        lines.append("| a uniformly random order | %d | %s | %s | %s |" % (
            args.epochs, fmt_spread([r[1] for r in ref], digits=2),
            fmt_spread([r[2] for r in ref], digits=2), fmt_spread([r[3] for r in ref], digits=2)))
        lines.append("")
    lines += ["Per run:", "", "| rep | scenario | system | time | accuracy after | epochs | "
              "class share off by, per epoch / per tenth (points) |",
              "|---:|---|---|---:|---:|---:|---:|"]
    for r in runs:
        lines.append("| %s | %s | %s | %.1f s | %.4f | %s | %s |" % (
            r["rep"], r["scenario"], r["system"], float(r["final_seconds"]),
            float(r["final_accuracy"]), r["epochs_covered"] or "–",
            ("%.2f / %.2f" % (float(r["epoch_dev"]), float(r["tenth_dev"])))
            if r["epoch_dev"] else "–"))
    text = ("<!-- torch-epochs:begin (bench/torch/versus_ddp.py --epochs writes this section) "
            "-->\n" + "\n".join(lines) + "\n\n![accuracy over time](%s)\n"
            % os.path.relpath(os.path.join(args.out, "accuracy.png"), os.path.join(ROOT, "bench"))
            + "<!-- torch-epochs:end -->\n")
    open(os.path.join(args.out, "summary.md"), "w").write(text)
    return text


def plot(args):
    curves = list(csv.DictReader(open(os.path.join(args.out, "curves.csv"))))
    cmds = []
    for scenario in SCENARIOS:
        for system in dict.fromkeys(SYSTEMS + list(PACER_MODES)):
            pts = [(float(c["t"]), float(c["accuracy"])) for c in curves
                   if c["rep"] == "1" and c["scenario"] == scenario and c["system"] == system]
            if not pts:
                continue
            dat = os.path.join(args.out, "curve-%s-%s.dat" % (scenario, system))
            with open(dat, "w") as f:
                f.writelines("%.3f %.4f\n" % p for p in sorted(pts))
            cmds.append("'%s' using 1:2 with lines lw 2 %s title '%s, %s'" % (
                dat, "dt 1" if scenario == "none" else "dt 3", system,
                {"none": "no straggler", "straggler": "4x straggler",
                 "ordered": "4x straggler, data sorted by label"}[scenario]))
    script = """set terminal pngcairo size 1000,600 noenhanced
set output '%s'
set title 'Fashion-MNIST CNN, 3 workers: DDP (gloo) and pacer.torch, rep 1'
set xlabel 'seconds since the first step'
set ylabel 'test accuracy (first %d test images)'
set yrange [0.6:0.95]
set grid
set key bottom right
plot %s, %.2f with lines dt 2 lc rgb 'gray' title '%.2f'
""" % (os.path.join(args.out, "accuracy.png"), args.test_limit, ", ".join(cmds), args.target,
       args.target)
    subprocess.run(["gnuplot"], input=script, text=True, check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=60.0,
                    help="each run's length without a straggler")
    ap.add_argument("--straggler-seconds", type=float, default=100.0,
                    help="each run's length with the straggler")
    ap.add_argument("--snapshot-every", type=float, default=1.0)
    ap.add_argument("--target", type=float, default=0.88)
    ap.add_argument("--test-limit", type=int, default=0,
                    help="score on the first N test images (default 5000; --epochs: 10000)")
    ap.add_argument("--epochs", type=int, default=0,
                    help="epochs mode: each run trains this many epochs (see above)")
    ap.add_argument("--epochs-cap", type=float, default=600.0,
                    help="epochs mode: the monitor's --time-cap, against a hung run")
    ap.add_argument("--partitions-seconds", type=float, default=120.0,
                    help="epochs mode: pacer-partitions' --time-cap (its straggler reads its "
                         "own partition alone for minutes)")
    ap.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd",
                    help="the torch optimizer of every system (bench/torch/worker.py)")
    ap.add_argument("--lr", type=float, default=0.0,
                    help="its lr (default: sgd 0.05 with momentum 0.9, adamw 1e-3)")
    ap.add_argument("--curve-every", type=int, default=6,
                    help="rep 1 beyond the target: evaluate every Nth snapshot for the plot")
    ap.add_argument("--systems", default="",
                    help="default ddp,pacer-bsp,pacer (--epochs: ddp,pacer; on ordered data "
                         "pacer-partitions too)")
    ap.add_argument("--ordered-systems", default="pacer,pacer-partitions",
                    help="epochs mode: the systems run on ordered data (DDP's sampler shuffles "
                         "the whole set; a uniformly shuffled order is scored off-line instead)")
    ap.add_argument("--scenarios", default="",
                    help="default none,straggler (--epochs: none,straggler,ordered)")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--keep-snapshots", action="store_true",
                    help="keep each run's weight snapshots (runs/*/snapshots*.pt) for rescoring")
    ap.add_argument("--results", action="store_true",
                    help="also replace the section in bench/RESULTS.md")
    args = ap.parse_args()
    args.test_limit = args.test_limit or (10000 if args.epochs else 5000)
    args.systems = args.systems or ("ddp,pacer" if args.epochs else ",".join(SYSTEMS))
    args.scenarios = args.scenarios or ("none,straggler,ordered" if args.epochs
                                        else "none,straggler")
    section = "torch-epochs" if args.epochs else "torch-ddp"
    args.build = os.path.abspath(args.build)
    sys.path.insert(0, os.path.join(args.build, "python"))  # train_fashion imports pacer
    args.when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    args.reps_done = lambda runs: max(int(r["rep"]) for r in runs) if runs else 0
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(2)
    if not args.report_only:
        systems = args.systems.split(",")
        scenarios = args.scenarios.split(",")
        ev = Evaluator(args.test_limit)
        import fashion_mnist
        counts = torch.bincount(fashion_mnist.load(train=True).tensors[1], minlength=10)
        share, n_train = (counts.double() / counts.sum()).tolist(), int(counts.sum())
        with open(os.path.join(args.out, "meta.json"), "w") as f:
            json.dump({"command": " ".join(sys.argv[1:]), "when": args.when}, f)
        with open(os.path.join(args.out, "runs.csv"), "w", newline="") as rf, \
                open(os.path.join(args.out, "curves.csv"), "w", newline="") as cf:
            runs = csv.writer(rf)
            curves = csv.writer(cf)
            runs.writerow(["rep", "scenario", "system", "time_to_target", "steps_to_target",
                           "final_seconds", "final_steps", "final_accuracy", "epochs_covered",
                           "epoch_dev", "tenth_dev", "tenth_dev_median"])
            curves.writerow(["rep", "scenario", "system", "t", "steps", "accuracy"])
            for rep in range(1, args.reps + 1):
                order = systems[(rep - 1) % len(systems):] + systems[:(rep - 1) % len(systems)]
                for scenario in scenarios:
                    mine = order
                    if args.epochs and scenario in SORTED:
                        mine = args.ordered_systems.split(",")
                    for system in mine:
                        run_dir = os.path.join(args.out, "runs", "%d-%s-%s" % (rep, scenario,
                                                                               system))
                        started = time.time()
                        snaps = run_one(args, run_dir, system, scenario)
                        t, steps, final_t, final_steps, final_acc, curve = evaluate(
                            ev, snaps, None if args.epochs else args.target,
                            args.curve_every if rep == 1 else 10 ** 9)
                        shares = class_shares(run_dir, share, n_train) if args.epochs else \
                            (0, None, None, None)
                        if not args.keep_snapshots:
                            os.remove(snaps)
                        runs.writerow([rep, scenario, system, "" if t is None else "%.2f" % t,
                                       "" if steps is None else steps, "%.2f" % final_t,
                                       final_steps, "%.4f" % final_acc, shares[0] or "",
                                       *("" if v is None else "%.3f" % v for v in shares[1:])])
                        curves.writerows([rep, scenario, system, "%.2f" % a, b, "%.4f" % c]
                                         for a, b, c in curve)
                        rf.flush()
                        cf.flush()
                        print("rep %d %-9s %-9s: %s, steps %s; after %.1f s: %.4f (%d steps); "
                              "%.0f s wall; class shares %s" % (
                                  rep, scenario, system,
                                  "not reached" if t is None else "%.1f s" % t, steps, final_t,
                                  final_acc, final_steps, time.time() - started, shares),
                              flush=True)
    text = summarise_epochs(args) if args.epochs else summarise(args)
    plot(args)
    print(text)
    if args.results:
        subprocess.run([os.path.join(ROOT, "bench", "stragglers", "put-section.py"),
                        os.path.join(ROOT, "bench", "RESULTS.md"), section,
                        "pacer.torch against PyTorch DDP, %s (bench/torch/versus_ddp.py%s)" % (
                            "epochs" if args.epochs else "to a target accuracy",
                            " --epochs" if args.epochs else ""),
                        os.path.join(args.out, "summary.md")], check=True)


if __name__ == "__main__":
    main()
