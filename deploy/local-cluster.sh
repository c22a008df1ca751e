#!/usr/bin/env bash
# Runs one Pacer job of the built-in pacer-worker on a local cluster on
# 127.0.0.1 (1 monitor, N shards, M workers) until the target accuracy or
# the time cap: pacer-run (worker/README.md) with the quick start's
# settings, plus a run under BSP to compare with (--compare), a Prometheus
# targets file and an exit code that says whether the target was reached.
# pacer-run starts, shows and stops every process (Ctrl-C stops them all).
# Used by deploy/quickstart.sh and the benchmarks; run it directly to try
# policies and stragglers. pacer-run runs any worker command, your own
# script included.
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
# At the end pacer-run prints a table per worker (mean batch and its share of
# the global batch, samples and its share of all the workers' samples, and
# the compute, communication and wait shares of its time), the monitor's
# lines for the last epochs of the data stream (each one's tail and each
# worker's share of its samples), and one line on what the straggler
# policy did. Exit code 0 when the target was reached, 1 when not (or
# when the job failed).
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
run="$bin/worker/pacer-run"
for b in worker/pacer-run monitor/pacer-monitor ps/pacer-server worker/pacer-worker; do
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
run_pid=""
keep_tmp=0
cleanup() {
  trap - EXIT INT TERM
  # Prometheus must not go on scraping ports nobody serves any more.
  [ -z "$targets_file" ] || rm -f "$targets_file"
  # pacer-run stops what it started; it only needs to be told.
  if [ -n "$run_pid" ]; then kill "$run_pid" 2>/dev/null || true; wait "$run_pid" 2>/dev/null || true; fi
  # A temporary folder goes, unless the job failed (pacer-run named it).
  [ -n "$out" ] || [ "$keep_tmp" -eq 1 ] || rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

stop_at=$target
[ "$keep" -eq 0 ] || stop_at=0
args=(--shards "$shards" --workers "$workers" --time-cap "$time_cap" --target-accuracy "$stop_at"
      --global-batch $((batch * workers)) --out "$tmp")
[ -z "$policy" ] || args+=(--policy "$policy")
[ -z "$mode" ] || args+=(--mode "$mode")
[ -z "$data_dir" ] || args+=(--data-dir "$data_dir")
[ "$quiet" -eq 0 ] || args+=(--quiet)
# The quick start's defaults first: a flag given again in --monitor-args wins.
args+=(--monitor-args "--lr 0.1 --momentum 0.9 --report-accuracy $target --eval-interval 0.5 $monitor_args")
[ -z "$shard_args" ] || args+=(--shard-args "$shard_args")
for i in "${!worker_args_i[@]}"; do args+=(--worker-args-of "$i:${worker_args_i[$i]}"); done
# shellcheck disable=SC2086  # --worker-args is word-split on purpose
"$run" "${args[@]}" -- pacer-worker --progress plain $worker_args &
run_pid=$!

if [ -n "$targets_file" ]; then
  # address_of FILE: waits for the line "metrics ADDRESS" in FILE.
  address_of() {
    local a
    for _ in $(seq 1 400); do
      a=$(sed -n "s/^metrics //p" "$1" 2>/dev/null | head -n 1)
      if [ -n "$a" ]; then echo "$a"; return 0; fi
      kill -0 "$run_pid" 2>/dev/null || break
      sleep 0.05
    done
    echo "local-cluster.sh: no 'metrics' line in $1" >&2
    return 1
  }
  # targets ROLE FILE...: one file_sd group, job "pacer-ROLE".
  targets() {
    local role=$1 sep="" list=""; shift
    for f in "$@"; do
      list+="$sep\"$(address_of "$f")\""
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

rc=0
wait "$run_pid" || rc=$?
run_pid=""
[ "$rc" -eq 0 ] || keep_tmp=1
[ "$rc" -ne 130 ] || exit 130
[ "$rc" -ne 2 ] || exit 2  # pacer-run refused an option (it said which)
acc=$(sed -n 's/^final test accuracy: //p' "$tmp/monitor.out")
ttt=$(sed -n "s/^time to [0-9.]*: //p" "$tmp/monitor.out")
if [ -z "$acc" ]; then
  echo "[cluster] the monitor reported no accuracy" >&2
  exit 1
fi
echo "final test accuracy: $acc"
echo "time to $target: $ttt"
pass=0
awk -v a="$acc" -v t="$target" 'BEGIN { exit !(a >= t) }' || pass=1
[ "$rc" -eq 0 ] || pass=1
if [ "$compare" -eq 1 ]; then
  # pacer-run has stopped this cluster: the next one runs alone.
  echo "[cluster] --compare: the same job under BSP (--policy fixed --mode bsp)" >&2
  bsp_out=$("$0" "${rerun[@]}" --quiet --policy fixed --mode bsp \
    2> >(sed -u -e 's/^\[cluster\]/[cluster, bsp]/' -e 's/^\[pacer-run\]/[pacer-run, bsp]/' >&2)) || true
  bsp_ttt=$(sed -n "s/^time to [0-9.]*: //p" <<< "$bsp_out")
  echo "time to $target under BSP: ${bsp_ttt:-not reached}"
  echo "${policy:-pacer} policy ${ttt} against BSP ${bsp_ttt:-not reached}" |
    awk '{ a = $3 + 0; b = $7 + 0; if ($4 == "s" && $8 == "s" && b > 0)
             printf "%s policy / BSP time to the target: %.2f\n", $1, a / b
           else print $0 }'
fi
exit "$pass"
