#!/usr/bin/env bash
# bench/stragglers/epochs.sh: epoch-bounded jobs (issue 47). The quick
# start's job (deploy/local-cluster.sh: 2 shards, 3 workers, Fashion-MNIST,
# MLP, batch 64 per worker) run for --epochs E, with and without one 4x
# straggler (the third worker, --slowdown 4), in four configurations:
#   bsp         --policy fixed --mode bsp, per-worker partitions (BSP as it was)
#   bsp-stream  --policy fixed --mode bsp --data-stream: the baseline
#   pacer       the default policy, per-worker partitions (--data-partitions 3,
#               as jobs ran before the data stream)
#   stream      the default policy with the data stream (one stream, chunks)
# Repetitions are interleaved (rep 1 of every run, then rep 2, ...), so that
# load on the shared machine hits every configuration alike.
#
#   bench/stragglers/epochs.sh [--reps N] [--epochs E] [--out DIR] [--no-results]
#                              [--configs LIST] [--scenarios LIST]
#
#   --reps N      repetitions (default 10)
#   --epochs E    epochs per job (default 2)
#   --configs L   comma-separated configurations (default all four)
#   --scenarios L straggler,none (default both)
#   --out DIR     where runs and the plot go (default bench/stragglers/out-epochs)
#   --no-results  do not rewrite the epochs section of bench/RESULTS.md
#   --report-only rebuild the tables and plot from DIR/runs.csv
#
# Besides each row's accuracy, the summary gives its accuracy minus
# bsp-stream's in the same repetition (points), median and range.
#
# Per run: the job's time (the monitor's "running" line to its last "epoch
# E done" line with --data-stream, else to its "stopping" line, when the
# last worker says it is done), the accuracy (with --data-stream the final
# evaluation the monitor holds the workers for; with partitions the last
# periodic one, up to 0.5 s before the end: nobody is left to evaluate),
# each epoch's tail (the "epoch E done ... tail" lines), and the floor: the
# job's samples over the sum of the workers' median samples/s (their
# progress lines, once a second). Writes
# DIR/runs.csv, DIR/summary.md, DIR/samples.png (each worker's samples over
# time in the first straggler run of pacer and of stream) and replaces the
# section between the epochs markers in bench/RESULTS.md.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
reps=10 epochs=2 out="$root/bench/stragglers/out-epochs" results=1 report_only=0
configs="bsp bsp-stream pacer stream" scenarios="straggler none"
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-results) results=0; shift ;;
    --report-only) report_only=1; shift ;;
    --configs) configs=${2//,/ }; shift 2 ;;
    --scenarios) scenarios=${2//,/ }; shift 2 ;;
    -h|--help) sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "epochs: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
py=/usr/bin/python3
mkdir -p "$out/runs"

declare -A config_flags=(
  [bsp]="--policy fixed --mode bsp"
  [bsp-stream]="--policy fixed --mode bsp"
  [pacer]=""
  [stream]=""
)
declare -A config_monitor=(
  [bsp]="--data-partitions 3"
  [bsp-stream]="--data-stream"
  [pacer]="--data-partitions 3"
  [stream]="--data-stream"
)

if [ "$report_only" -eq 0 ]; then
  echo "rep,scenario,config,seconds,accuracy,floor,tails,samples" > "$out/runs.csv"
  for rep in $(seq 1 "$reps"); do
    for scenario in $scenarios; do
      for config in $configs; do
        dir="$out/runs/$scenario-$config-$rep"
        rm -rf "$dir"
        args=(--quiet --target 0.99 --time-cap 120 --out "$dir"
              --monitor-args "--epochs $epochs ${config_monitor[$config]}")
        # shellcheck disable=SC2206
        args+=(${config_flags[$config]})
        for i in 0 1 2; do
          extra="--step-log $dir/steps-$i.log"
          if [ "$scenario" = straggler ] && [ "$i" = 2 ]; then extra="$extra --slowdown 4"; fi
          args+=("--worker-args-$i" "$extra")
        done
        mkdir -p "$dir"
        # (It exits 1 when --target is not reached, as here by design.)
        "$root/deploy/local-cluster.sh" "${args[@]}" > "$dir/cluster.out" 2>&1 || true
        if ! grep -q "stopping the job" "$dir/monitor.log" 2>/dev/null; then
          echo "epochs: run $scenario $config $rep failed (see $dir)" >&2
          continue
        fi
        row=$("$py" - "$dir" "$epochs" <<'EOF'
import re, statistics, sys, datetime
d, epochs = sys.argv[1], int(sys.argv[2])
log = open(d + "/monitor.log").read()
def at(pattern):
    m = re.search(r"^(\S+) \S+ \[monitor\] .*" + pattern, log, re.M)
    return datetime.datetime.fromisoformat(m.group(1)) if m else None
ends = re.findall(r"^(\S+) \S+ \[monitor\] epoch \d+ done", log, re.M)
start = at(r"job \d+ running")
stop = datetime.datetime.fromisoformat(ends[-1]) if ends else at(r"stopping the job")
seconds = (stop - start).total_seconds() if start and stop else float("nan")
acc = re.search(r"final test accuracy: ([0-9.]+)", open(d + "/cluster.out").read())
tails = re.findall(r"epoch \d+ done at [0-9.]+ s: tail ([0-9.]+) s", log)
speeds, samples = [], 0
for i in range(3):
    w = open("%s/worker%d.log" % (d, i)).read()
    sps = [float(x) for x in re.findall(r"epoch [0-9.]+ clock \d+ loss [0-9.na]+ ([0-9.]+) samples/s", w)]
    if len(sps) > 1: sps = sps[:-1]  # the last window is cut short by the end
    speeds.append(statistics.median(sps) if sps else 0)
    m = re.search(r"(\d+) samples in", w)
    samples += int(m.group(1)) if m else 0
floor = samples / sum(speeds) if sum(speeds) > 0 else float("nan")
print("%.3f,%s,%.3f,%s,%d" % (seconds, acc.group(1) if acc else "nan", floor, "/".join(tails), samples))
EOF
)
        echo "$rep,$scenario,$config,$row" >> "$out/runs.csv"
        echo "epochs: rep $rep $scenario $config: $row" >&2
      done
    done
  done
fi

"$py" - "$out" "$epochs" "$reps" <<'EOF'
import csv, statistics, sys, os, datetime
out, epochs, reps = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = list(csv.DictReader(open(out + "/runs.csv")))
def get(scenario, config, field):
    return {int(r["rep"]): float(r[field]) for r in rows
            if r["scenario"] == scenario and r["config"] == config and r[field] not in ("", "nan")}
def med(xs): return statistics.median(xs) if xs else float("nan")
def spread(xs): return "%.2f-%.2f" % (min(xs), max(xs)) if xs else "-"
lines = []
lines.append("<!-- epochs:begin (written by bench/stragglers/epochs.sh; edits here are overwritten) -->")
lines.append("")
lines.append("`bench/stragglers/epochs.sh --reps %s --epochs %d`, %s, 2 shared cores (the "
             "quick start's job: 2 shards, 3 workers, MLP, batch 64 per worker, Fashion-MNIST; "
             "`--target 0.99` so only the epochs end it). Repetitions "
             "interleaved; medians, with the range over the repetitions; ratios are medians of "
             "the per-repetition ratios." % (reps, epochs, datetime.date.today().isoformat()))
lines.append("")
lines.append("| scenario | config | job time s | vs bsp-stream | vs floor | accuracy | "
             "accuracy − bsp-stream's (points) | tail per epoch s (max) |")
lines.append("|---|---|---|---|---|---|---|---|")
for scenario in ("straggler", "none"):
    bsp = get(scenario, "bsp-stream", "seconds")
    bsp_acc = get(scenario, "bsp-stream", "accuracy")
    for config in ("bsp", "bsp-stream", "pacer", "stream"):
        t = get(scenario, config, "seconds")
        if not t:
            continue
        fl = get(scenario, config, "floor")
        acc = get(scenario, config, "accuracy")
        ratio = [t[r] / bsp[r] for r in t if r in bsp]
        gap = [100 * (acc[r] - bsp_acc[r]) for r in acc if r in bsp_acc]
        vs_floor = [t[r] / fl[r] for r in t if r in fl and fl[r] > 0]
        tails = []
        for r in rows:
            if r["scenario"] == scenario and r["config"] == config and r["tails"]:
                tails.append(max(float(x) for x in r["tails"].split("/")))
        lines.append("| %s | %s | %.2f (%s) | %.2f (%s) | %.2f (%s) | %.4f (%s) | %+.2f (%s) | %s |" % (
            scenario, config, med(list(t.values())), spread(list(t.values())),
            med(ratio), spread(ratio), med(vs_floor), spread(vs_floor),
            med(list(acc.values())), spread(list(acc.values())), med(gap),
            "%+.2f to %+.2f" % (min(gap), max(gap)) if gap else "-",
            "%.2f (%s)" % (med(tails), spread(tails)) if tails else "-"))
lines.append("")
lines.append("![each worker's samples over time](stragglers/out-epochs/samples.png)")
lines.append("")
lines.append("<!-- epochs:end -->")
open(out + "/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))

# Each worker's cumulative samples over time, first straggler run of pacer and stream.
with open(out + "/samples.dat", "w") as f:
    for config in ("pacer", "stream"):
        d = "%s/runs/straggler-%s-1" % (out, config)
        for i in range(3):
            p = "%s/steps-%d.log" % (d, i)
            if not os.path.exists(p): continue
            total = 0
            f.write("# %s worker %d\n" % (config, i))
            for line in open(p):
                t, clock, batch = line.split()[:3]
                total += int(batch)
                f.write("%s %d\n" % (t, total))
            f.write("\n\n")
EOF

if command -v gnuplot >/dev/null && [ -e "$out/runs/straggler-pacer-1" ] &&
   [ -e "$out/runs/straggler-stream-1" ]; then
  gnuplot <<EOF
set terminal pngcairo size 900,420 font ",10"
set output "$out/samples.png"
set multiplot layout 1,2 title "Samples trained by each worker over time, --epochs $epochs, worker 2 a 4x straggler"
set xlabel "seconds since training started"
set ylabel "samples"
set key left top
set title "pacer, per-worker partitions (--data-partitions 3)"
plot "$out/samples.dat" index 0 with lines title "worker 0", "" index 1 with lines title "worker 1", "" index 2 with lines title "worker 2 (4x)"
set title "pacer, the data stream (the default)"
plot "$out/samples.dat" index 3 with lines title "worker 0", "" index 4 with lines title "worker 1", "" index 5 with lines title "worker 2 (4x)"
unset multiplot
EOF
fi

if [ "$results" -eq 1 ]; then
  "$py" "$root/bench/stragglers/put-section.py" "$root/bench/RESULTS.md" epochs \
    "Epoch-bounded jobs: the data stream against partitions and BSP" "$out/summary.md"
fi
