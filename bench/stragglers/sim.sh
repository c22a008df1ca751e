#!/usr/bin/env bash
# The cluster simulator (pacer-sim) from 4 to 1024 workers: throughput as a
# fraction of the ideal (the sum of the workers' speeds) per mode and
# straggler scenario, and the policy's decision time. Writes
# bench/stragglers/out/sim.csv and replaces the simulator section of
# bench/RESULTS.md (between the sim markers).
#
#   bench/stragglers/sim.sh [--seconds S] [--no-results] [--report-only]
#   (--report-only: rebuild the tables from the last run's CSV)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin="${PACER_BUILD_DIR:-$root/build}"
seconds=30 results=1 report_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --no-results) results=0; shift ;;
    --report-only) report_only=1; shift ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "sim.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
out="$root/bench/stragglers/out"
mkdir -p "$out"
csv="$out/sim.csv"
sizes=(4 16 64 256 1024)
scenarios=(static hetero moving bursts)
declare -A flags=(
  [bsp]="--mode bsp --policy fixed"
  [backup]="--mode backup --policy fixed --backup-workers=1"
  [ssp]="--mode ssp --policy fixed --staleness=3"
  [adaptive-batch]="--mode bsp --policy adaptive-batch"
  [pacer]="--mode dssp --policy pacer --staleness=8 --staleness-range=4"
)
modes=(bsp backup ssp adaptive-batch pacer)
noisy_modes=(bsp adaptive-batch pacer)
if [ "$report_only" -eq 0 ]; then
echo "label,$("$bin/bench/pacer-sim" --csv-header)" > "$csv"
start=$(date +%s)
for n in "${sizes[@]}"; do
  for s in "${scenarios[@]}"; do
    for m in "${modes[@]}"; do
      # shellcheck disable=SC2086
      "$bin/bench/pacer-sim" --workers "$n" --scenario "$s" --seconds "$seconds" ${flags[$m]} \
        --policy-interval 0.25 --csv | sed "s/^/$m,/" >> "$csv"
    done
  done
done
# The same under a noisy shared node: every worker's compute x (1 + x(t)),
# x an Ornstein-Uhlenbeck process (sd 0.15, correlation time 0.5 s, clipped
# to +-30%), and co-located jobs (one per worker per 20 s on average,
# lasting 5 s, each 30% slower). Labelled MODE@noise.
noise_flags="--noise 0.3 --noise-seconds 0.5 --colocated-rate 0.05 --colocated-seconds 5 --colocated-load 0.3"
for n in "${sizes[@]}"; do
  for s in none "${scenarios[@]}"; do
    for m in "${noisy_modes[@]}"; do
      # shellcheck disable=SC2086
      "$bin/bench/pacer-sim" --workers "$n" --scenario "$s" --seconds "$seconds" ${flags[$m]} \
        --policy-interval 0.25 $noise_flags --csv | sed "s/^/$m@noise,/" >> "$csv"
    done
  done
done
elapsed=$(( $(date +%s) - start ))
echo "$elapsed" > "$out/sim.elapsed"
fi
elapsed=$(cat "$out/sim.elapsed" 2>/dev/null || echo "?")
# tables LABEL TITLE SCENARIO...: one table per scenario, a row per mode
# (noisy=1: the noisy modes), cells the fraction of the ideal of rows
# labelled MODE LABEL.
tables() {
  local label=$1 title=$2 s m n
  shift 2
  local rows=("${modes[@]}")
  [ "${noisy:-0}" -eq 1 ] && rows=("${noisy_modes[@]}")
  for s in "$@"; do
    printf "| %s%s | %s |\n" "$s" "$title" "$(printf "%s | " "${sizes[@]/#/n=}" | sed 's/ | $//')"
    printf "|---|%s\n" "$(printf -- "---:|%.0s" "${sizes[@]}")"
    for m in "${rows[@]}"; do
      printf "| %s |" "$m"
      for n in "${sizes[@]}"; do
        awk -F, -v n="$n" -v m="$m$label" -v s="$s" '$2 == n && $1 == m && $5 == s { printf " %.3f |", $8 }' "$csv"
      done
      echo
    done
    echo
  done
}
summary="$out/sim.md"
{
  echo "<!-- sim:begin (written by bench/stragglers/sim.sh; edits here are overwritten) -->"
  echo "Run of $(date -u +%Y-%m-%d) on $(nproc) cores, ${elapsed} s in all: \`bench/stragglers/sim.sh\`,"
  echo "$seconds simulated seconds per cell; defaults of pacer-sim: 33 µs compute per sample,"
  echo "5 ms communication per iteration, batch 64 per worker, stragglers 4x slower (static: the"
  echo "last worker; hetero: factors spread over 1..4; moving: one straggler moving every 20 s;"
  echo "bursts: each worker 4x slow for 2 s bursts, 0.05 per second). Cells: throughput as a"
  echo "fraction of the ideal. backup drops the last worker's push (k = 1) at every size."
  echo "Workers report with a heartbeat every 0.1 s, whose reply brings their batch size, as"
  echo "in the real job; policy rounds every 0.25 s, or at once on a confirmed level shift. pacer runs"
  echo "dssp with s_L = 8, r_max = 4: at scale the bound has to cover the clocks a worker"
  echo "loses between a burst's start and the reply that shrinks its batch."
  echo
  tables "" "" "${scenarios[@]}"
  echo "Under a noisy shared node (\`--noise 0.3 --noise-seconds 0.5 --colocated-rate 0.05"
  echo "--colocated-seconds 5 --colocated-load 0.3\`: each worker's compute x (1 + x(t)), x an"
  echo "Ornstein-Uhlenbeck process with sd 0.15 and correlation time 0.5 s, clipped to +-30%,"
  echo "and co-located jobs, one per worker per 20 s on average, lasting 5 s, each 30% slower)."
  echo "Cells: throughput as a fraction of the noise-free ideal; *none* has no straggler."
  echo
  noisy=1 tables "@noise" ", noisy" none "${scenarios[@]}"
  echo "pacer on the noisy node without a straggler: the share of samples applied in steps"
  echo "where every batch was within [0.5, 1.5] x B/n, and the least batch over B/n:"
  echo
  printf "| | %s |\n" "$(printf "%s | " "${sizes[@]/#/n=}" | sed 's/ | $//')"
  printf "|---|%s\n" "$(printf -- "---:|%.0s" "${sizes[@]}")"
  printf "| stable share |"
  for n in "${sizes[@]}"; do
    awk -F, -v n="$n" '$2 == n && $1 == "pacer@noise" && $5 == "none" { printf " %.3f |", $17 }' "$csv"
  done
  echo
  printf "| least batch / (B/n) |"
  for n in "${sizes[@]}"; do
    awk -F, -v n="$n" '$2 == n && $1 == "pacer@noise" && $5 == "none" { printf " %.2f |", $18 }' "$csv"
  done
  echo
  echo
  echo "Policy decision time (one round of pacer, real time, mean / max over the run):"
  echo
  echo "| workers | mean (ms) | max (ms) |"
  echo "|---:|---:|---:|"
  for n in "${sizes[@]}"; do
    awk -F, -v n="$n" '$2 == n && $1 == "pacer" { if ($14 > mx) mx = $14; sum += $13; k++ }
      END { printf "| %d | %.3f | %.3f |\n", n, sum / k, mx }' "$csv"
  done
  echo
  echo "<!-- sim:end -->"
} > "$summary"
cat "$summary"
if [ "$results" -eq 1 ]; then
  "$root/bench/stragglers/put-section.py" "$root/bench/RESULTS.md" sim \
    "Cluster simulator (bench/stragglers/sim.sh)" "$summary"
fi
