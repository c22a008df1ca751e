#!/usr/bin/env bash
# bench/replication/lease_noise.sh: does a shard lease short enough to fail
# over fast fail over on noise? One job with pacer-monitor --replicas 1
# --shard-lease 1 (3 shards, 2 CPU workers, BSP) trains for --minutes (5)
# beside a co-located load, `stress-ng --cpu 2 --cpu-load 30` (--load),
# with no fault at all. Counts the failovers the monitor logged (and its
# pacer_monitor_failovers_total at the end): the target is none.
#
#   bench/replication/lease_noise.sh [--minutes M] [--load PCT] [--lease S] [--out DIR]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
minutes=5 load=30 lease=1 out="$root/bench/replication/out/lease-noise"
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes=$2; shift 2 ;;
    --load) load=$2; shift 2 ;;
    --lease) lease=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "lease_noise: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
command -v stress-ng >/dev/null || { echo "lease_noise: needs stress-ng (apt install stress-ng)" >&2; exit 2; }
rm -rf "$out"
mkdir -p "$out"
seconds=$((minutes * 60))
stress-ng --cpu 2 --cpu-load "$load" --timeout "$((seconds + 30))s" >"$out/stress-ng.txt" 2>&1 &
stress=$!
trap 'kill "$stress" 2>/dev/null || true' EXIT
"$root/deploy/local-cluster.sh" --shards 3 --workers 2 --time-cap "$seconds" --keep-training \
  --policy fixed --mode bsp --batch 64 --quiet --out "$out/cluster" \
  --monitor-args "--replicas 1 --shard-lease $lease" --worker-args "--model mlp --device cpu" \
  >"$out/cluster.txt" 2>&1 || true
kill "$stress" 2>/dev/null || true
failovers=$(grep -c 'failover:' "$out/cluster/monitor.log" || true)
fenced=$(cat "$out/cluster"/shard*.log | grep -c 'stops answering' || true)
clocks=$(grep -h '^worker summary:' "$out/cluster"/worker*.out | sed 's/.*clocks=\([0-9]*\).*/\1/' | sort -n | tail -1)
echo "lease_noise: ${minutes} min, stress-ng --cpu 2 --cpu-load $load, --shard-lease $lease:" \
  "failovers $failovers, shards fenced $fenced time(s), clocks trained ${clocks:-none}"
[ -n "${clocks:-}" ] || { echo "lease_noise: the job did not train (see $out)" >&2; exit 1; }
[ "$failovers" -eq 0 ]
