#!/usr/bin/env bash
# Runs one Pacer job on a local cluster on 127.0.0.1 (1 monitor, N shards,
# M workers) until the target accuracy or the time cap, then stops every
# process it started. Every port is bound as 0 and read back from what each
# process prints. Ctrl-C stops everything. Used by deploy/quickstart.sh and
# bench/stragglers; run it directly to try policies and stragglers.
#
#   deploy/local-cluster.sh [options]
#     --shards N            shards (default 2)
#     --workers N           workers (default 3)
#     --time-cap S          stop after S seconds of training (default 120)
#     --target A            stop at this test accuracy (default 0.85)
#     --keep-training       run to --time-cap; the target is only timed
#     --policy P            fixed, adaptive-batch or pacer (default: the
#                           monitor's, pacer)
#     --mode M              bsp, asp, ssp, dssp or backup (default: the
#                           policy's; pacer runs dssp)
#     --batch B             batch per worker; B x workers is the global batch
#                           (default 64)
#     --compare             then run the same job under BSP (--policy fixed
#                           --mode bsp) and print both times to the target
#                           and their ratio (the BSP run keeps no logs and
#                           no checkpoints: --out and --data-dir are not
#                           passed on)
#     --monitor-args "F"    extra flags for pacer-monitor
#     --shard-args "F"      extra flags for every pacer-server
#     --worker-args "F"     extra flags for every pacer-worker
#     --worker-args-I "F"   extra flags for the I-th worker started, from 0:
#                           the launch order, shown as [worker #I] until the
#                           worker registers; then [worker ID rank R], with
#                           the ID that pacerctl and the logs use
#     --data-dir DIR        shard I checkpoints to DIR/shardI (default: none)
#     --out DIR             keep every process's stdout and log there
#                           (default: a temporary folder, removed at exit)
#     --quiet               do not show the processes' output, only the end
#     --targets-file FILE   write every process's /metrics address there, as
#                           Prometheus file_sd JSON (deploy/prometheus)
#
# At the end it prints a table per worker (mean batch and its share of the
# global batch, samples and its share of all the workers' samples, and the
# compute, communication and wait shares of its time), the monitor's line
# for each epoch's end of the data stream (its tail and each worker's
# share of its samples), and one line on what the straggler policy did.
#
# Example, a 4x straggler under the pacer policy, against BSP:
#   deploy/local-cluster.sh --worker-args-2 "--slowdown 4" --compare
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
shards=2 workers=3 time_cap=120 target=0.85 policy="" mode="" batch=64 out="" quiet=0 keep=0
monitor_args="" worker_args="" shard_args="" data_dir="" targets_file=""
compare=0
declare -A worker_args_i=()
# The arguments the BSP run of --compare repeats: all but --compare,
# --policy, --mode, --out, --targets-file and --data-dir (it checkpoints
# nothing: the first job's checkpoints are not its own).
rerun=()
while [ $# -gt 0 ]; do
  case "$1" in
    --compare|--quiet|--keep-training|-h|--help) n=1 ;;
    *) n=2; [ $# -ge 2 ] || { echo "local-cluster.sh: $1 needs a value (see --help)" >&2; exit 2; } ;;
  esac
  case "$1" in
    --compare|--policy|--mode|--out|--targets-file|--data-dir) ;;
    *) rerun+=("${@:1:n}") ;;
  esac
  case "$1" in
    --shards) shards=$2 ;;
    --workers) workers=$2 ;;
    --time-cap) time_cap=$2 ;;
    --target) target=$2 ;;
    --policy) policy=$2 ;;
    --mode) mode=$2 ;;
    --batch) batch=$2 ;;
    --compare) compare=1 ;;
    --monitor-args) monitor_args=$2 ;;
    --worker-args) worker_args=$2 ;;
    --shard-args) shard_args=$2 ;;
    --data-dir) data_dir=$2 ;;
    --worker-args-[0-9]*) worker_args_i[${1#--worker-args-}]=$2 ;;
    --out) out=$2 ;;
    --quiet) quiet=1 ;;
    --keep-training) keep=1 ;;
    --targets-file) targets_file=$2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "local-cluster.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift "$n"
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

# prefix NAME FILE: shows each line as "[NAME] line". Once the process says who
# the monitor made it, NAME becomes that: "worker 4 rank 1" (the id pacerctl
# and the logs use) or "shard 1". The plain-ZeroMQ warning every process
# logs is left to the files: this script says it once. FILE.name passes the
# name learnt from the log (stderr) to the stdout side.
worker_re='worker ([0-9]+): registered as rank ([0-9]+)'
shard_re='shard ([0-9]+): registered with'
prefix() {
  local name=$1 file=$2 line
  while IFS= read -r line; do
    if [[ $line =~ $worker_re ]]; then
      name="worker ${BASH_REMATCH[1]} rank ${BASH_REMATCH[2]}"
      echo "$name" > "$file.name"
    elif [[ $line =~ $shard_re ]]; then
      name="shard ${BASH_REMATCH[1]}"
      echo "$name" > "$file.name"
    elif [[ $name == *"#"* && -s $file.name ]]; then
      read -r name < "$file.name"
    fi
    if [[ $line == *"transport security is off"* ]]; then
      continue
    fi
    printf '[%s] %s\n' "$name" "$line"
  done
}

# start NAME FILE CMD...: runs CMD with stdout to FILE.out and its log to
# FILE.log; unless --quiet, every line is also shown with a [NAME] prefix.
start() {
  local name=$1 file=$2; shift 2
  if [ "$quiet" -eq 1 ]; then
    ( exec "$@" ) > "$file.out" 2> "$file.log" &
  else
    rm -f "$file.name"
    ( exec "$@" ) > >(tee "$file.out" | prefix "$name" "$file") \
      2> >(tee "$file.log" | prefix "$name" "$file" >&2) &
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
  "machine; between machines use CURVE keys (deploy/README.md, 'Transport security')" >&2
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
  start "shard #$i" "$tmp/shard$i" "$bin/ps/pacer-server" --listen tcp://127.0.0.1:0 \
    --monitor "$monitor" "${shard_dir[@]}" $shard_args
done
for i in $(seq 0 $((workers - 1))); do
  # shellcheck disable=SC2086
  start "worker #$i" "$tmp/worker$i" "$bin/worker/pacer-worker" --monitor "$monitor" \
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

# wait_all: waits (at most 5 s) until every process started here is gone.
wait_all() {
  for _ in $(seq 1 50); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" -eq 0 ] && return 0
    sleep 0.1
  done
}

wait "$monitor_pid" || true
# Give the others a moment to hear the stop and exit on their own.
wait_all

acc=$(sed -n 's/^final test accuracy: //p' "$tmp/monitor.out")
ttt=$(sed -n "s/^time to [0-9.]*: //p" "$tmp/monitor.out")
if [ -z "$acc" ]; then
  echo "[cluster] the monitor reported no accuracy" >&2
  exit 1
fi
echo "final test accuracy: $acc"
echo "time to $target: $ttt"
# Per worker, from its summary line (stdout) and the id it registered with;
# B as the monitor last had it (--monitor-args may change it).
global_batch=$(sed -n 's/.* of B = \([0-9]*\)$/\1/p' "$tmp/monitor.out")
[ -n "$global_batch" ] || global_batch=$((batch * workers))
# Every worker's samples, for each one's share of them.
total_samples=0
for i in $(seq 0 $((workers - 1))); do
  n=$(sed -n 's/^worker summary: .*samples=\([0-9]*\).*/\1/p' "$tmp/worker$i.out" | tail -n 1)
  total_samples=$((total_samples + ${n:-0}))
done
{
  printf '%-18s %10s %10s %10s %8s %8s %8s %8s\n' worker "mean batch" "share of B" samples share \
    compute comm wait
  for i in $(seq 0 $((workers - 1))); do
    name="worker #$i"
    id=$(sed -n 's/.*worker \([0-9]*\): registered as rank \([0-9]*\).*/\1 rank \2/p' "$tmp/worker$i.log" | tail -n 1)
    [ -z "$id" ] || name="worker $id"
    sed -n 's/^worker summary: //p' "$tmp/worker$i.out" | tail -n 1 |
      awk -v name="$name" -v B="$global_batch" -v total="$total_samples" '{
        for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        t = v["seconds"] > 0 ? v["seconds"] : 1
        mean = v["clocks"] > 0 ? v["samples"] / v["clocks"] : 0
        printf "%-18s %10.1f %9.0f%% %10d %7.1f%% %7.0f%% %7.0f%% %7.0f%%\n", name, mean, 100 * mean / B,
               v["samples"], (total > 0 ? 100 * v["samples"] / total : 0),
               100 * v["compute_s"] / t, 100 * v["communication_s"] / t, 100 * v["wait_s"] / t
      }'
  done
  # The data stream: each epoch's end, its tail, and each worker's share of it.
  sed -n 's/.*\[monitor\] \(epoch [0-9]* done.*\)/\1/p' "$tmp/monitor.log"
  sed -n '/ policy: /p' "$tmp/monitor.out"
} | sed 's/^/[cluster] /' >&2
pass=0
awk -v a="$acc" -v t="$target" 'BEGIN { exit !(a >= t) }' || pass=1
if [ "$compare" -eq 1 ]; then
  # This cluster must be gone before the next one runs beside it.
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait_all
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  echo "[cluster] --compare: the same job under BSP (--policy fixed --mode bsp)" >&2
  bsp_out=$("$0" "${rerun[@]}" --quiet --policy fixed --mode bsp \
    2> >(sed -u 's/^\[cluster\]/[cluster, bsp]/' >&2)) || true
  bsp_ttt=$(sed -n "s/^time to [0-9.]*: //p" <<< "$bsp_out")
  echo "time to $target under BSP: ${bsp_ttt:-not reached}"
  echo "${policy:-pacer} policy ${ttt} against BSP ${bsp_ttt:-not reached}" |
    awk '{ a = $3 + 0; b = $7 + 0; if ($4 == "s" && $8 == "s" && b > 0)
             printf "%s policy / BSP time to the target: %.2f\n", $1, a / b
           else print $0 }'
fi
exit "$pass"
