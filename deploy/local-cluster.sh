#!/usr/bin/env bash
# Runs one Pacer job on a local cluster on 127.0.0.1 (1 monitor, N shards,
# M workers) until the target accuracy or the time cap, then stops every
# process it started. Every port is bound as 0 and read back from what each
# process prints. Ctrl-C stops everything. Used by deploy/quickstart.sh and
# bench/stragglers; run it directly to try policies and stragglers.
#
#   deploy/local-cluster.sh [--shards N] [--workers N] [--time-cap S] [--target A]
#       [--policy fixed|adaptive-batch|pacer] [--mode bsp|asp|ssp|dssp|backup]
#       [--batch PER_WORKER] [--monitor-args "FLAGS"] [--worker-args "FLAGS"]
#       [--worker-args-I "FLAGS"] (I: the I-th worker started, from 0)
#       [--shard-args "FLAGS"] [--data-dir DIR] (shard I checkpoints to DIR/shardI)
#       [--out DIR] (keep every process's stdout and log there) [--quiet]
#       [--keep-training] (run to --time-cap; the target is only timed)
#       [--targets-file FILE] (write every process's /metrics address there, as
#       Prometheus file_sd JSON: see deploy/prometheus/prometheus.yml)
#
# Example, a 4x straggler under the pacer policy:
#   deploy/local-cluster.sh --policy pacer --worker-args-2 "--slowdown 4"
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
shards=2 workers=3 time_cap=120 target=0.85 policy="" mode="" batch=64 out="" quiet=0 keep=0
monitor_args="" worker_args="" shard_args="" data_dir="" targets_file=""
declare -A worker_args_i=()
while [ $# -gt 0 ]; do
  case "$1" in
    --shards) shards=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --time-cap) time_cap=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    --policy) policy=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --monitor-args) monitor_args=$2; shift 2 ;;
    --worker-args) worker_args=$2; shift 2 ;;
    --shard-args) shard_args=$2; shift 2 ;;
    --data-dir) data_dir=$2; shift 2 ;;
    --worker-args-[0-9]*) worker_args_i[${1#--worker-args-}]=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --quiet) quiet=1; shift ;;
    --keep-training) keep=1; shift ;;
    --targets-file) targets_file=$2; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "local-cluster.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

bin="${PACER_BUILD_DIR:-$root/build}"
for b in monitor/pacer-monitor ps/pacer-server worker/pacer-worker; do
  if [ ! -x "$bin/$b" ]; then
    echo "local-cluster.sh: $bin/$b is missing; run deploy/setup.sh first" >&2
    exit 1
  fi
done
if [ -n "$out" ]; then
  mkdir -p "$out"
  tmp=$out
else
  tmp=$(mktemp -d -t pacer-cluster.XXXXXX)
fi
pids=()

cleanup() {
  trap - EXIT INT TERM
  # Prometheus must not go on scraping ports nobody serves any more.
  [ -z "$targets_file" ] || rm -f "$targets_file"
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.5
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  [ -n "$out" ] || rm -rf "$tmp"
}
trap cleanup EXIT
trap 'echo "[cluster] interrupted" >&2; exit 130' INT TERM

# start NAME FILE CMD...: runs CMD with stdout to FILE.out and its log to
# FILE.log; unless --quiet, every line is also shown with a [NAME] prefix.
start() {
  local name=$1 file=$2; shift 2
  if [ "$quiet" -eq 1 ]; then
    ( exec "$@" ) > "$file.out" 2> "$file.log" &
  else
    ( exec "$@" ) > >(tee "$file.out" | sed -u "s/^/[$name] /") \
      2> >(tee "$file.log" | sed -u "s/^/[$name] /" >&2) &
  fi
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
  echo "local-cluster.sh: no '$what' line in $file" >&2
  return 1
}

stop_at=$target
[ "$keep" -eq 0 ] || stop_at=0
policy_flags=()
[ -z "$policy" ] || policy_flags+=(--policy "$policy")
[ -z "$mode" ] || policy_flags+=(--mode "$mode")
echo "[cluster] 1 monitor, $shards shard(s), $workers worker(s)," \
  "${policy:-default} policy, ${mode:-default} mode" >&2
echo "[cluster] warning: plain ZeroMQ on 127.0.0.1 (no --key/--allowed-keys): fine on one" \
  "machine; between machines use CURVE keys (README, 'Transport security')" >&2
# shellcheck disable=SC2086  # the *-args options are word-split on purpose
start monitor "$tmp/monitor" "$bin/monitor/pacer-monitor" --listen tcp://127.0.0.1:0 \
  "${policy_flags[@]}" --min-shards "$shards" --min-workers "$workers" \
  --global-batch $((batch * workers)) --lr 0.1 --momentum 0.9 --target-accuracy "$stop_at" \
  --report-accuracy "$target" --time-cap "$time_cap" --eval-interval 0.5 $monitor_args
monitor_pid=${pids[-1]}
monitor=$(address_of "$tmp/monitor.out" listening)
for i in $(seq 0 $((shards - 1))); do
  shard_dir=()
  [ -z "$data_dir" ] || shard_dir=(--data-dir "$data_dir/shard$i")
  # shellcheck disable=SC2086
  start "shard $i" "$tmp/shard$i" "$bin/ps/pacer-server" --listen tcp://127.0.0.1:0 \
    --monitor "$monitor" "${shard_dir[@]}" $shard_args
done
for i in $(seq 0 $((workers - 1))); do
  # shellcheck disable=SC2086
  start "worker $i" "$tmp/worker$i" "$bin/worker/pacer-worker" --monitor "$monitor" \
    --progress plain $worker_args ${worker_args_i[$i]:-}
done

if [ -n "$targets_file" ]; then
  # targets ROLE FILE...: one file_sd group, job "pacer-ROLE".
  targets() {
    local role=$1 sep="" list=""; shift
    for f in "$@"; do
      list+="$sep\"$(address_of "$f" metrics)\""
      sep=", "
    done
    printf '  {"targets": [%s], "labels": {"job": "pacer-%s"}}' "$list" "$role"
  }
  shard_outs=() worker_outs=()
  for i in $(seq 0 $((shards - 1))); do shard_outs+=("$tmp/shard$i.out"); done
  for i in $(seq 0 $((workers - 1))); do worker_outs+=("$tmp/worker$i.out"); done
  {
    echo "["
    targets monitor "$tmp/monitor.out"; echo ","
    targets server "${shard_outs[@]}"; echo ","
    targets worker "${worker_outs[@]}"; echo
    echo "]"
  } > "$targets_file.tmp"
  mv "$targets_file.tmp" "$targets_file"  # Prometheus never reads half a file
  echo "[cluster] Prometheus targets in $targets_file" >&2
fi

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
  echo "[cluster] the monitor reported no accuracy" >&2
  exit 1
fi
echo "final test accuracy: $acc"
echo "time to $target: $ttt"
awk -v a="$acc" -v t="$target" 'BEGIN { exit !(a >= t) }'
