#!/usr/bin/env bash
# bench/replication: what shard replication costs in training throughput:
# the same local cluster (deploy/local-cluster.sh: 1 monitor, 3 shards, 2
# CPU workers, MLP, fixed policy, batch 64 per worker) with pacer-monitor
# --replicas 0 (the baseline) and --replicas 1 (every range copied to a
# backup after aggregation), in BSP, SSP and ASP, alternating 0/1 runs so
# that drift in this machine's load hits both alike.
#
#   bench/replication/run.sh [--reps N] [--seconds S] [--modes "bsp ssp asp"] [--out DIR]
#                            [--pin]
#
# --pin: the monitor and shards on CPU 0, the workers on CPU 1 (taskset),
# as where servers and workers have CPUs of their own; without it all six
# processes share every core, and a backup's work takes CPU from the
# workers.
#
# Prints one row per run (steps per second: the workers' clocks over their
# seconds, summed over the workers) and per mode the median of each and
# their ratio, replicas 1 over replicas 0, and each pair's ratio (the runs
# of one rep, next to each other in time) with their median.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
reps=3 seconds=15 modes="bsp ssp asp" out="$root/bench/replication/out" pin=0
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --pin) pin=1; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "replication: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
rm -rf "$out"
mkdir -p "$out"
csv="$out/runs.csv"
echo "mode,replicas,rep,steps_per_s,samples_per_s" >"$csv"
for mode in $modes; do
  for rep in $(seq 1 "$reps"); do
    for replicas in 0 1; do
      dir="$out/$mode-r$replicas-$rep"
      launch=()
      [ "$pin" -eq 0 ] || launch=(taskset -c 0)
      "${launch[@]}" "$root/deploy/local-cluster.sh" --shards 3 --workers 2 --time-cap "$seconds" \
        --keep-training --policy fixed --mode "$mode" --batch 64 --quiet --out "$dir" \
        --monitor-args "--replicas $replicas" --worker-args "--model mlp --device cpu" \
        >"$dir.txt" 2>&1 &
      cluster=$!
      if [ "$pin" -eq 1 ]; then
        # The workers (children of the cluster script, started after the
        # shards) move to CPU 1 with every thread, within 0.1 s of starting.
        pinned=""
        while kill -0 "$cluster" 2>/dev/null; do
          for p in $(pgrep -f "${PACER_BUILD_DIR:-$root/build}/worker/pacer-worker" || true); do
            case " $pinned " in *" $p "*) continue ;; esac
            taskset -a -p -c 1 "$p" >/dev/null 2>&1 && pinned="$pinned $p"
          done
          [ "$(wc -w <<<"$pinned")" -ge 2 ] && break
          sleep 0.1
        done
      fi
      wait "$cluster" || true
      # (local-cluster.sh exits 1 when the target accuracy was not reached.)
      if ! grep -qs '^worker summary:' "$dir"/worker*.out; then
        echo "replication: run $dir failed:" >&2
        tail -20 "$dir.txt" >&2
        exit 1
      fi
      # worker summary: rank=R clocks=C samples=S seconds=T ...
      cat "$dir"/worker*.out | grep '^worker summary:' | awk -v m="$mode" -v k="$replicas" -v r="$rep" '
        { for (i = 3; i <= NF; ++i) { split($i, kv, "="); v[kv[1]] = kv[2] }
          n++; steps += v["clocks"] / v["seconds"]; sps += v["samples"] / v["seconds"] }
        END { if (n == 0) exit 1; printf "%s,%s,%d,%.1f,%.0f\n", m, k, r, steps, sps }' >>"$csv"
      tail -1 "$csv"
    done
  done
done
# The middle value; of an even count, the mean of the two middle ones.
median() {
  sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2];
                                      else printf "%.4g\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
echo
echo "| mode | runs | steps/s, replicas 0 (median) | steps/s, replicas 1 (median) | ratio | pair ratios (median; each) | all runs, 0 / 1 |"
echo "|---|---:|---:|---:|---:|---|---|"
for mode in $modes; do
  r0=$(grep "^$mode,0," "$csv" | cut -d, -f4 | median)
  r1=$(grep "^$mode,1," "$csv" | cut -d, -f4 | median)
  n=$(grep -c "^$mode,0," "$csv")
  pairs=$(paste -d, <(grep "^$mode,0," "$csv" | cut -d, -f4) <(grep "^$mode,1," "$csv" | cut -d, -f4))
  all=$(tr , / <<<"$pairs" | paste -sd' ')
  ratios=$(awk -F, '{ printf "%.2f\n", $2 / $1 }' <<<"$pairs")
  rmed=$(median <<<"$ratios")
  awk -v m="$mode" -v n="$n" -v a="$r0" -v b="$r1" -v rm="$rmed" -v each="$(paste -sd' ' <<<"$ratios")" \
    -v all="$all" 'BEGIN { printf "| %s | %d | %s | %s | %.2f | %.2f; %s | %s |\n", m, n, a, b, b / a, rm, each, all }'
done
