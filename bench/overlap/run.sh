#!/usr/bin/env bash
# bench/overlap: what overlapping communication with compute buys in
# training throughput: the same local cluster (deploy/local-cluster.sh: 2
# shards, 2 CPU workers, BSP, fixed policy) with pacer-worker --overlap off
# (pull, compute, then one push) and on (each layer pushed as the backward
# pass finishes it; the batch prepared while the pull is answered), for the
# MLP and the CNN, alternating off/on runs so that drift in this machine's
# load hits both alike.
#
#   bench/overlap/run.sh [--reps N] [--seconds S] [--batch B] [--out DIR]
#
# Prints one table row per run and a median row per configuration; the
# workers' own summaries (compute, communication and wait seconds) are the
# source. The baseline is --overlap off in the same invocation.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
reps=3 seconds=15 batch=64 out="$root/bench/overlap/out"
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "overlap: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
rm -rf "$out"
mkdir -p "$out"
csv="$out/runs.csv"
echo "model,overlap,rep,samples_per_s_per_worker,compute_s_per_iter,communication_s_per_iter,wait_s_per_iter" >"$csv"
for model in mlp cnn; do
  for rep in $(seq 1 "$reps"); do
    for overlap in off on; do
      dir="$out/$model-$overlap-$rep"
      "$root/deploy/local-cluster.sh" --shards 2 --workers 2 --time-cap "$seconds" --keep-training \
        --policy fixed --mode bsp --batch "$batch" --quiet --out "$dir" \
        --worker-args "--model $model --overlap $overlap --device cpu" >"$dir.txt" 2>&1 || true
      # (local-cluster.sh exits 1 when the target accuracy was not reached.)
      if ! grep -qs '^worker summary:' "$dir"/worker*.out; then
        echo "overlap: run $dir failed:" >&2
        tail -20 "$dir.txt" >&2
        exit 1
      fi
      # worker summary: rank=R clocks=C samples=S seconds=T compute_s=X communication_s=Y wait_s=Z ...
      cat "$dir"/worker*.out | grep '^worker summary:' | awk -v m="$model" -v o="$overlap" -v r="$rep" '
        { for (i = 3; i <= NF; ++i) { split($i, kv, "="); v[kv[1]] = kv[2] }
          n++; sps += v["samples"] / v["seconds"]; it += v["clocks"];
          c += v["compute_s"]; cm += v["communication_s"]; w += v["wait_s"] }
        END { if (n == 0 || it == 0) exit 1;
              printf "%s,%s,%d,%.0f,%.5f,%.5f,%.5f\n", m, o, r, sps / n, c / it, cm / it, w / it }' >>"$csv"
      tail -1 "$csv"
    done
  done
done
echo
echo "| model | overlap | runs | samples/s per worker (median) | compute s/iter | communication s/iter | wait s/iter |"
echo "|---|---|---:|---:|---:|---:|---:|"
for model in mlp cnn; do
  for overlap in off on; do
    grep "^$model,$overlap," "$csv" | sort -t, -k4,4n | awk -F, '
      { a[NR] = $0 } END { split(a[int((NR + 1) / 2)], f, ",");
        printf "| %s | %s | %d | %s | %s | %s | %s |\n", f[1], f[2], NR, f[4], f[5], f[6], f[7] }'
  done
done
