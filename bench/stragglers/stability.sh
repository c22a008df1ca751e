#!/usr/bin/env bash
# bench/stragglers/stability.sh: does the pacer policy stay calm on a noisy
# node? Runs the quick start's job (deploy/local-cluster.sh: 2 shards, 3
# identical workers, batch 64 each, the default pacer policy over dssp) for
# 20 s of training, once on the machine as it is and once beside a
# co-located load (stress-ng --cpu 2 --cpu-load 30), and reports from the
# workers' own per-step records (--sample-log) the share of training steps
# taken with a batch outside [0.5, 1.5] x B/n, and from the monitor's log the
# level-shift rounds per 10 s of training. The targets: at most 5% and at
# most 2 per 10 s, in both runs.
#
#   bench/stragglers/stability.sh [--seconds S] [--out DIR] [--monitor-args "FLAGS"]
#
# Prints one line per run and writes DIR/stability.csv (default
# bench/stragglers/out/stability).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
seconds=20 out="$root/bench/stragglers/out/stability" monitor_args=""
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --monitor-args) monitor_args=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "stability: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
command -v stress-ng >/dev/null || { echo "stability: stress-ng missing (deploy/setup.sh installs it)" >&2; exit 1; }
mkdir -p "$out"
csv="$out/stability.csv"
echo "load,steps,outside,outside_share,level_shift_rounds,training_seconds,shifts_per_10s" > "$csv"
workers=3 batch=64

# run LOAD: one job; LOAD is idle or colocated.
run() {
  local load=$1 dir="$out/$1" stress_pid=""
  rm -rf "$dir"
  mkdir -p "$dir"
  if [ "$load" = colocated ]; then
    stress-ng --cpu 2 --cpu-load 30 --timeout $((seconds + 60))s > "$dir/stress.txt" 2>&1 &
    stress_pid=$!
  fi
  local wargs=()
  for i in $(seq 0 $((workers - 1))); do
    wargs+=(--worker-args-"$i" "--sample-log $dir/samples$i.txt")
  done
  "$root/deploy/local-cluster.sh" --quiet --keep-training --out "$dir/job" --time-cap "$seconds" \
    --workers "$workers" --batch "$batch" ${monitor_args:+--monitor-args "$monitor_args"} \
    "${wargs[@]}" > "$dir/job.txt" 2>&1 || true
  [ -z "$stress_pid" ] || { kill "$stress_pid" 2>/dev/null || true; wait "$stress_pid" 2>/dev/null || true; }
  # A sample-log line is one consumed batch: partition, epoch, then its samples.
  local even=$((batch))  # B / n
  read -r steps outside < <(cat "$dir"/samples*.txt | awk -v e="$even" '
    { b = NF - 2; n++; if (b < 0.5 * e || b > 1.5 * e) o++ } END { print n + 0, o + 0 }')
  local shifts training
  shifts=$(grep -c "speed shift was confirmed" "$dir/job/monitor.log" || true)
  training=$(awk '/worker summary:/ { for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == "seconds" && kv[2] > s) s = kv[2] } } END { print s + 0 }' "$dir"/job/worker*.out)
  awk -v l="$load" -v st="$steps" -v o="$outside" -v sh="$shifts" -v t="$training" 'BEGIN {
    share = st > 0 ? o / st : 0; per = t > 0 ? 10 * sh / t : 0
    printf "%s,%d,%d,%.4f,%d,%.1f,%.2f\n", l, st, o, share, sh, t, per }' >> "$csv"
  tail -1 "$csv" | awk -F, '{ printf "[stability] %s: %d steps, %d (%.1f%%) with a batch outside [0.5, 1.5] x B/n; %d level-shift rounds in %.1f s of training (%.2f per 10 s)\n", $1, $2, $3, 100 * $4, $5, $6, $7 }' >&2
}

run idle
run colocated
echo "stability: $csv" >&2
