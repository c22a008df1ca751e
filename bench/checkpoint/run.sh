#!/usr/bin/env bash
# What checkpointing costs in training throughput (issue 4): the same local
# cluster (deploy/local-cluster.sh: 2 shards, 2 workers, BSP) trained for a
# fixed time without checkpoints, and with every shard checkpointing every
# 1 s and every 0.2 s. Runs are interleaved (none, 1 s, 0.2 s, none, ...).
# Throughput = optimizer steps (clocks) the shards applied in the run.
#
#   bench/checkpoint/run.sh [--reps N] [--seconds S] [--layers L] [--out DIR]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
reps=3 seconds=25 layers=784,1024,1024,10 out=$root/bench/checkpoint/out
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
csv=$out/runs.csv
echo "mode,rep,steps,seconds,steps_per_second,checkpoints,checkpoint_mb,checkpoint_mean_s" >"$csv"
for rep in $(seq 1 "$reps"); do
  for mode in none 1 0.2; do
    run=$out/$mode-$rep
    rm -rf "$run"
    args=()
    if [ "$mode" != none ]; then
      args=(--data-dir "$run/data" --shard-args "--checkpoint-interval $mode --log-level debug")
    fi
    "$root/deploy/local-cluster.sh" --shards 2 --workers 2 --mode bsp --policy fixed \
      --time-cap "$seconds" --keep-training --quiet --out "$run" \
      --worker-args "--layers $layers --train-limit 30000 --test-limit 1000" "${args[@]}" \
      >/dev/null 2>&1 || true
    steps=$(sed -n 's/.*final: steps \([0-9]*\),.*/\1/p' "$run/shard0.log" | head -1)
    ckpts=$(grep -c "shard [0-9]*: checkpoint at applied clock" "$run/shard0.log" || true)
    mb=$(sed -n 's/.*checkpoint at applied clock [0-9-]* (\([0-9]*\) bytes in \([0-9.]*\) s).*/\1/p' \
      "$run/shard0.log" | tail -1)
    mean=$(sed -n 's/.*checkpoint at applied clock [0-9-]* ([0-9]* bytes in \([0-9.]*\) s).*/\1/p' \
      "$run/shard0.log" | awk '{ s += $1; n++ } END { if (n) printf "%.4f", s / n; else print 0 }')
    sps=$(awk -v s="${steps:-0}" -v t="$seconds" 'BEGIN { printf "%.3f", s / t }')
    echo "$mode,$rep,${steps:-0},$seconds,$sps,$ckpts,$(awk -v b="${mb:-0}" 'BEGIN { printf "%.2f", b / 1e6 }'),$mean" \
      | tee -a "$csv"
  done
done
echo
echo "mode: median steps/s, ratio to none"
for mode in none 1 0.2; do
  awk -F, -v m="$mode" '$1 == m { print $5 }' "$csv" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
done | paste -sd' ' | awk '{ printf "none %.3f\n1 s  %.3f (%.3fx)\n0.2 s %.3f (%.3fx)\n", $1, $2, $2 / $1, $3, $3 / $1 }'
