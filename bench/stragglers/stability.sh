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
# Then two runs with a straggler (worker 2 of 3):
#   slow   --slowdown 4 from the start: after the first 3 s, the share of
#          the workers' steps (--step-log) whose iteration time (compute +
#          communication, waiting excluded) is within +-15% of the median
#          (target: at least 90%).
#   shift  --slowdown-schedule 0:1,8:4: seconds from the worker's switch to
#          4x to its first step (its own --step-log) with under half its
#          even share (target: about a second).
#
#   bench/stragglers/stability.sh [--seconds S] [--out DIR] [--monitor-args "FLAGS"]
#                                 [--runs "idle colocated slow shift"] [--batch B]
#
# --batch is each worker's batch at the start (default 64, the quick start's).
#
# Prints one line per run and writes DIR/stability.csv and DIR/straggler.csv
# (default bench/stragglers/out/stability).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
seconds=20 out="$root/bench/stragglers/out/stability" monitor_args="" runs="idle colocated slow shift" batch=64
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --monitor-args) monitor_args=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "stability: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$batch" in ''|*[!0-9]*|0) echo "stability: --batch must be a positive integer, got '$batch'" >&2; exit 2 ;; esac
command -v stress-ng >/dev/null || { echo "stability: stress-ng missing (deploy/setup.sh installs it)" >&2; exit 1; }
mkdir -p "$out"
csv="$out/stability.csv"
echo "load,steps,outside,outside_share,level_shift_rounds,training_seconds,shifts_per_10s" > "$csv"
scsv="$out/straggler.csv"
echo "run,steps_after_3s,within_15pct,within_share,median_iteration_s,reaction_s" > "$scsv"
workers=3


# iteration_stats DIR: of the steps (DIR/steps*.txt) after the first 3 s,
# "count within-15%-of-the-median share median": iteration time = compute +
# communication, waiting excluded.
iteration_stats() {
  cat "$1"/steps*.txt | awk '$1 >= 3 { print $4 + $5 }' | sort -g | awk '
    { t[NR] = $1 } END {
      if (NR == 0) { print "0 0 0 0"; exit }
      m = (NR % 2) ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2
      for (i = 1; i <= NR; i++) if (t[i] >= 0.85 * m && t[i] <= 1.15 * m) w++
      printf "%d %d %.4f %.6f\n", NR, w, w / NR, m }'
}

# straggler RUN: one job with worker 2 slowed (RUN: slow or shift).
straggler() {
  local name=$1 dir="$out/$1" slow
  rm -rf "$dir"
  mkdir -p "$dir"
  if [ "$name" = slow ]; then slow="--slowdown 4"; else slow="--slowdown-schedule 0:1,8:4"; fi
  local wargs=()
  for i in $(seq 0 $((workers - 1))); do
    local extra=""
    [ "$i" -eq 2 ] && extra=" $slow"
    wargs+=(--worker-args-"$i" "--step-log $dir/steps$i.txt$extra")
  done
  "$root/deploy/local-cluster.sh" --quiet --keep-training --out "$dir/job" --time-cap "$seconds" \
    --workers "$workers" --batch "$batch" ${monitor_args:+--monitor-args "$monitor_args"} \
    "${wargs[@]}" > "$dir/job.txt" 2>&1 || true
  local stats
  stats=$(iteration_stats "$dir" 2>/dev/null || true)
  [ -n "$stats" ] || stats="0 0 0 0"
  local reaction=NA
  if [ "$name" = shift ]; then
    # From the straggler's own step log (time since training started, step,
    # batch, ...; the same clock as its --slowdown-schedule): seconds from
    # the switch at 8 s to its first step with a batch under half of B/n.
    # (The monitor's log is no measure: it shows interval rounds at most
    # every 5 s.)
    reaction=$(awk -v half=$((batch / 2)) -v at=8 '
      $1 >= at && $3 < half { printf "%.2f\n", $1 - at; exit }' "$dir/steps2.txt" 2>/dev/null || true)
  fi
  echo "$name,$(echo "$stats" | tr ' ' ','),${reaction:-NA}" >> "$scsv"
  tail -1 "$scsv" | awk -F, '{ printf "[stability] %s: %d steps after 3 s, %.1f%% within 15%% of the median iteration (%.1f ms); reaction to the 4x switch: %s s\n", $1, $2, 100 * $4, 1e3 * $5, $6 }' >&2
}

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
    wargs+=(--worker-args-"$i" "--sample-log $dir/samples$i.txt --step-log $dir/steps$i.txt")
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
  # The same iteration-time figure as the straggler runs, as their baseline:
  # how much a step's time varies on this machine with nobody slowed.
  echo "$load,$(iteration_stats "$dir" | tr ' ' ','),NA" >> "$scsv"
  tail -1 "$scsv" | awk -F, '{ printf "[stability] %s: %.1f%% of steps after 3 s within 15%% of the median iteration (%.1f ms)\n", $1, 100 * $4, 1e3 * $5 }' >&2
}

for r in $runs; do
  case "$r" in
    idle|colocated) run "$r" ;;
    slow|shift) straggler "$r" ;;
    *) echo "stability: unknown run '$r'" >&2; exit 2 ;;
  esac
done
echo "stability: $csv, $scsv" >&2
