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

    bench/torch/versus_ddp.py [--reps 3] [--seconds 60] [--straggler-seconds 100]
                              [--out DIR] [--results]
    bench/torch/versus_ddp.py --report-only [--out DIR] [--results]
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
SCENARIOS = {"none": 1.0, "straggler": 4.0}
# pacer-adaptive (not run by default): adaptive batch sizes over BSP, the
# pacer policy without DSSP.
PACER_MODES = {"pacer-bsp": ["--mode", "bsp", "--policy", "fixed"], "pacer": [],
               "pacer-adaptive": ["--policy", "adaptive-batch"]}
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


def seconds(args, scenario):
    return args.seconds if scenario == "none" else args.straggler_seconds


def run_one(args, run_dir, system, scenario):
    """Runs one job; the evaluator's snapshot file."""
    os.makedirs(run_dir, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.path.join(args.build, "python"))
    straggler, cap = SCENARIOS[scenario], seconds(args, scenario)
    worker = ["/usr/bin/python3", os.path.join(HERE, "worker.py"), "--seconds", str(cap),
              "--optimizer", args.optimizer, "--lr", str(args.lr),
              "--straggler", str(straggler), "--snapshot-every", str(args.snapshot_every),
              "--world", str(WORLD)]
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
                    "--snapshots", os.path.join(run_dir, "snapshots%d.pt" % r)], env))
        else:
            start("monitor", [os.path.join(args.build, "monitor", "pacer-monitor"), "--listen",
                              "tcp://127.0.0.1:0", "--metrics-addr", "off", "--min-workers",
                              str(WORLD), "--min-shards", "2", "--global-batch", str(64 * WORLD),
                              "--time-cap", str(cap), "--optimizer", args.optimizer,
                              *PACER_MODES[system]])
            monitor = wait_address(os.path.join(run_dir, "monitor.out"))
            for i in range(2):
                start("shard%d" % i, [os.path.join(args.build, "ps", "pacer-server"), "--listen",
                                      "tcp://127.0.0.1:0", "--monitor", monitor,
                                      "--metrics-addr", "off"])
            for r in range(WORLD):
                workers.append(start("worker%d" % r, worker + [
                    "--system", "pacer", "--snapshots",
                    os.path.join(run_dir, "snapshots%d.pt" % r)],
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
    need = math.ceil(target * n - 1e-9)
    right = {}

    def at(i):
        if i not in right:
            right[i] = ev.correct(rows[i][2])
        return right[i]

    hit = None
    for i in range(len(rows)):
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
                "no straggler" if scenario == "none" else "4x straggler"))
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
    ap.add_argument("--test-limit", type=int, default=5000)
    ap.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd",
                    help="the torch optimizer of every system (bench/torch/worker.py)")
    ap.add_argument("--lr", type=float, default=0.0,
                    help="its lr (default: sgd 0.05 with momentum 0.9, adamw 1e-3)")
    ap.add_argument("--curve-every", type=int, default=6,
                    help="rep 1 beyond the target: evaluate every Nth snapshot for the plot")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--keep-snapshots", action="store_true",
                    help="keep each run's weight snapshots (runs/*/snapshots*.pt) for rescoring")
    ap.add_argument("--results", action="store_true",
                    help="also replace the section in bench/RESULTS.md")
    args = ap.parse_args()
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
        with open(os.path.join(args.out, "meta.json"), "w") as f:
            json.dump({"command": " ".join(sys.argv[1:]), "when": args.when}, f)
        with open(os.path.join(args.out, "runs.csv"), "w", newline="") as rf, \
                open(os.path.join(args.out, "curves.csv"), "w", newline="") as cf:
            runs = csv.writer(rf)
            curves = csv.writer(cf)
            runs.writerow(["rep", "scenario", "system", "time_to_target", "steps_to_target",
                           "final_seconds", "final_steps", "final_accuracy"])
            curves.writerow(["rep", "scenario", "system", "t", "steps", "accuracy"])
            for rep in range(1, args.reps + 1):
                order = systems[(rep - 1) % len(systems):] + systems[:(rep - 1) % len(systems)]
                for scenario in scenarios:
                    for system in order:
                        run_dir = os.path.join(args.out, "runs", "%d-%s-%s" % (rep, scenario,
                                                                               system))
                        started = time.time()
                        snaps = run_one(args, run_dir, system, scenario)
                        t, steps, final_t, final_steps, final_acc, curve = evaluate(
                            ev, snaps, args.target, args.curve_every if rep == 1 else 10 ** 9)
                        if not args.keep_snapshots:
                            os.remove(snaps)
                        runs.writerow([rep, scenario, system, "" if t is None else "%.2f" % t,
                                       "" if steps is None else steps, "%.2f" % final_t,
                                       final_steps, "%.4f" % final_acc])
                        curves.writerows([rep, scenario, system, "%.2f" % a, b, "%.4f" % c]
                                         for a, b, c in curve)
                        rf.flush()
                        cf.flush()
                        print("rep %d %-9s %-9s: %s, steps %s; after %.0f s: %.3f (%d steps); "
                              "%.0f s wall" % (rep, scenario, system,
                                               "not reached" if t is None else "%.1f s" % t,
                                               steps, final_t, final_acc, final_steps,
                                               time.time() - started), flush=True)
    text = summarise(args)
    plot(args)
    print(text)
    if args.results:
        subprocess.run([os.path.join(ROOT, "bench", "stragglers", "put-section.py"),
                        os.path.join(ROOT, "bench", "RESULTS.md"), "torch-ddp",
                        "pacer.torch against PyTorch DDP (bench/torch/versus_ddp.py)",
                        os.path.join(args.out, "summary.md")], check=True)


if __name__ == "__main__":
    main()
