#!/usr/bin/env bash
# bench/replication/failover_time.sh: failover time, from the SIGKILL of a
# primary to the first push durable again. Runs a pacer-chaos scenario
# (--replicas 1, --shard-lease 1, 3 shards, 2 workers, BSP; shard 0 killed
# 8 s into training, nothing restarted) --runs times (3), and reads from
# each worker's journal the first "durable" line after the kill whose seq
# passes the last push acknowledged before it: the moment every range,
# the promoted one included (its new backup seeded), held a push again.
#
#   bench/replication/failover_time.sh [--runs N] [--out DIR]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
runs=3 out="$root/bench/replication/out/failover-time"
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "failover_time: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
chaos="$root/build/tests/chaos/pacer-chaos"
[ -x "$chaos" ] || { echo "failover_time: build first (no $chaos)" >&2; exit 2; }
rm -rf "$out"
mkdir -p "$out"
cat >"$out/failover.yaml" <<'EOF'
name: failover-time
description: kill -9 a primary with --replicas 1 and restart nothing (bench/replication/failover_time.sh)
seconds: 16
cluster:
  shards: 3
  workers: 2
  mode: bsp
  monitor_args: [--replicas, "1", --shard-lease, "1"]
  worker_args: [--train-limit, "12000", --test-limit, "2000"]
timeline:
  - {at: 8, do: kill, target: "shard:0"}
invariants:
  progress_within: 6
EOF
for run in $(seq 1 "$runs"); do
  dir="$out/run$run"
  "$chaos" "$out/failover.yaml" --out "$dir" >"$dir.txt" 2>&1 || { echo "failover_time: run $run failed (see $dir.txt)" >&2; exit 1; }
  # The runner logs the kill in UTC ("2026-12-05T00:31:02.123 ... kill shard:0").
  stamp=$(grep 'kill shard:0' "$dir.txt" | head -1 | cut -d' ' -f1)
  kill_unix=$(date -u -d "${stamp/T/ }" +%s.%N)
  for j in "$dir"/worker*.acks; do
    awk -v k="$kill_unix" '
      $1 == "durable" { if ($2 > k && $3 > last_acked && !done) { printf "%.3f\n", $2 - k; done = 1 }; next }
      $1 <= k { last_acked = $2 }' "$j"
  done | sort -n | tail -1 | sed "s/^/run $run: kill to first durable push (slowest worker): /;s/$/ s/"
done
