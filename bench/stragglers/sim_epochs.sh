#!/usr/bin/env bash
# The data stream (pacer-monitor --data-stream) in the cluster simulator
# (pacer-sim --data-samples), graded with the straggler policy at 64 to
# 1024 workers: epoch-bounded jobs of 2 epochs over 50000 samples per
# worker, BSP against the pacer policy (DSSP), with one 4x straggler
# (static) and with speeds spread over 1x..4x (hetero). Per run: the time
# to end the epochs, the floor (their samples over the ideal throughput:
# every worker busy at its own speed), the longest epoch tail, and the
# monitor's real time per DataStream call (its hand-out cost). Writes
# bench/stragglers/out-sim-epochs/sim-epochs.csv and replaces the
# sim-epochs section of bench/RESULTS.md.
#
#   bench/stragglers/sim_epochs.sh [--no-results]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin="${PACER_BUILD_DIR:-$root/build}"
results=1
case "${1:-}" in
  --no-results) results=0 ;;
  -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "sim_epochs.sh: unknown option '$1'" >&2; exit 2 ;;
esac
out="$root/bench/stragglers/out-sim-epochs"
mkdir -p "$out"
csv="$out/sim-epochs.csv"
declare -A flags=(
  [bsp]="--mode bsp --policy fixed"
  [pacer]="--mode dssp --policy pacer --staleness=8 --staleness-range=4"
)
echo "label,$("$bin/bench/pacer-sim" --csv-header)" > "$csv"
start=$(date +%s)
for n in 64 256 1024; do
  for scenario in static hetero; do
    for mode in bsp pacer; do
      # shellcheck disable=SC2086
      row=$("$bin/bench/pacer-sim" --workers "$n" --scenario "$scenario" --slow-factor 4 \
        ${flags[$mode]} --data-samples $((50000 * n)) --epochs 2 --seconds 600 --csv)
      echo "$mode,$row" >> "$csv"
      echo "sim_epochs: $n $scenario $mode" >&2
    done
  done
done
elapsed=$(( $(date +%s) - start ))

/usr/bin/python3 - "$csv" "$elapsed" > "$out/summary.md" <<'EOF'
import csv, sys, datetime
rows = list(csv.DictReader(open(sys.argv[1])))
print("<!-- sim-epochs:begin (written by bench/stragglers/sim_epochs.sh; edits here are overwritten) -->")
print()
print("`bench/stragglers/sim_epochs.sh`, %s (%s s of real time): pacer-sim with the data stream, "
      "2 epochs of 50000 samples per worker, batch 64 per worker, 33 us per sample, 5 ms of "
      "communication per iteration, heartbeats every 0.1 s. Time to end the epochs, the floor "
      "(their samples over the sum of the workers' speeds), and the longest epoch tail "
      "(simulated seconds). The monitor's cost of the stream, in real time on this machine: "
      "each exchange with a worker (DataStream's Report and Assign: its positions, and a "
      "hand-out or take-over when one is due, as on every heartbeat), timed around the calls; "
      "mean and largest over the run. Not in it: the monitor's save of its state after a "
      "change, which partitions pay too." %
      (datetime.date.today().isoformat(), sys.argv[2]))
print()
print("| workers | scenario | policy | epochs | time s | floor s | time / floor | longest tail s "
      "| monitor calls | us per call (mean / max) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    ratio = float(r["epochs_s"]) / float(r["epochs_floor_s"]) if float(r["epochs_floor_s"]) > 0 else 0
    print("| %s | %s | %s | %s | %.2f | %.2f | %.2f | %.3f | %s | %.2f / %.0f |" % (
        r["workers"], r["scenario"], r["label"], r["epochs_done"], float(r["epochs_s"]),
        float(r["epochs_floor_s"]), ratio, float(r["max_tail_s"]), r["stream_calls"],
        float(r["stream_mean_us"]), float(r["stream_max_us"])))
print()
print("<!-- sim-epochs:end -->")
EOF
cat "$out/summary.md"
if [ "$results" -eq 1 ]; then
  /usr/bin/python3 "$root/bench/stragglers/put-section.py" "$root/bench/RESULTS.md" sim-epochs \
    "The data stream in the simulator, 64 to 1024 workers" "$out/summary.md"
fi
