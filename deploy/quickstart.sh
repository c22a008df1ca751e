#!/usr/bin/env bash
# Pacer quick start: set up, then train Fashion-MNIST on a local cluster on
# 127.0.0.1 (1 monitor, 2 shards, 3 workers, BSP) until test accuracy 0.85
# or a time cap. Every port is bound as 0 and read back from what each
# process prints. Ctrl-C stops everything this script started.
#
#   deploy/quickstart.sh [--shards N] [--workers N] [--time-cap S] [--target A]
#                        [--mode bsp|asp] [--skip-setup]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
shards=2 workers=3 time_cap=120 target=0.85 mode=bsp skip_setup=0
while [ $# -gt 0 ]; do
  case "$1" in
    --shards) shards=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --time-cap) time_cap=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --skip-setup) skip_setup=1; shift ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "quickstart.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

[ "$skip_setup" -eq 1 ] || "$root/deploy/setup.sh"
bin="$root/build"
tmp=$(mktemp -d -t pacer-quickstart.XXXXXX)
pids=()

cleanup() {
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.5
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'echo "[quickstart] interrupted" >&2; exit 130' INT TERM

# start NAME OUTFILE CMD...: runs CMD with stdout to OUTFILE and every line
# (stdout and stderr) shown with a [NAME] prefix.
start() {
  local name=$1 out=$2; shift 2
  ( exec "$@" ) > >(tee "$out" | sed -u "s/^/[$name] /") 2> >(sed -u "s/^/[$name] /" >&2) &
  pids+=($!)
}

# address_of FILE WHAT: waits for the line "WHAT ADDRESS" in FILE.
address_of() {
  local file=$1 what=$2
  for _ in $(seq 1 200); do
    local a
    a=$(sed -n "s/^$what //p" "$file" 2>/dev/null | head -n 1)
    if [ -n "$a" ]; then echo "$a"; return 0; fi
    sleep 0.05
  done
  echo "quickstart: no '$what' line in $file" >&2
  return 1
}

echo "[quickstart] starting 1 monitor, $shards shard(s), $workers worker(s) in $mode" >&2
start monitor "$tmp/monitor.out" "$bin/monitor/pacer-monitor" --listen tcp://127.0.0.1:0 \
  --mode "$mode" --min-shards "$shards" --min-workers "$workers" --global-batch $((64 * workers)) \
  --lr 0.1 --momentum 0.9 --target-accuracy "$target" --report-accuracy "$target" \
  --time-cap "$time_cap" --eval-interval 0.5
monitor_pid=${pids[-1]}
monitor=$(address_of "$tmp/monitor.out" listening)
for i in $(seq 0 $((shards - 1))); do
  start "shard $i" "$tmp/shard$i.out" "$bin/ps/pacer-server" --listen tcp://127.0.0.1:0 \
    --monitor "$monitor"
done
for i in $(seq 0 $((workers - 1))); do
  start "worker $i" "$tmp/worker$i.out" "$bin/worker/pacer-worker" --monitor "$monitor" \
    --progress plain
done

wait "$monitor_pid" || true
# Give the others a moment to hear the stop and exit on their own.
for _ in $(seq 1 50); do
  alive=0
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
  [ "$alive" -eq 0 ] && break
  sleep 0.1
done

acc=$(sed -n 's/^final test accuracy: //p' "$tmp/monitor.out")
ttt=$(sed -n "s/^time to [0-9.]*: //p" "$tmp/monitor.out")
if [ -z "$acc" ]; then
  echo "[quickstart] the monitor reported no accuracy" >&2
  exit 1
fi
echo "final test accuracy: $acc"
echo "time to $target: $ttt"
awk -v a="$acc" -v t="$target" 'BEGIN { exit !(a >= t) }'
