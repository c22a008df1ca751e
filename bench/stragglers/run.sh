#!/usr/bin/env bash
# bench/stragglers: time to accuracy under stragglers, every consistency mode
# and policy against every straggler scenario, on a real local cluster
# (deploy/local-cluster.sh: 2 shards, 3 workers, Fashion-MNIST, MLP, batch 64
# per worker), plus a compute-bound configuration (batch 1024 per worker).
#
#   bench/stragglers/run.sh [--reps N] [--seconds S] [--out DIR] [--quick]
#                           [--no-results]
#
#   --reps N      repetitions of the no-straggler and 4x-straggler runs
#                 (medians are reported; the others run once). Default 3.
#   --seconds S   every run trains for S seconds (final accuracy is read
#                 there; the time to 0.85 is when it was first reported).
#   --out DIR     where runs, CSVs and the plot go (default bench/stragglers/out).
#   --quick       1 repetition, 12 s runs, no compute-bound configuration:
#                 checks the script, not the figures.
#   --no-results  do not rewrite the section of bench/RESULTS.md.
#   --modes "M.." / --scenarios "S.."  run only these (default: all).
#   --report-only  run nothing: rebuild the tables and plot from DIR's CSVs.
#   --no-compute   skip the compute-bound configuration.
#   --all-reps     repeat the moving and contention runs too (default: once).
#
# Writes DIR/runs.csv (one row per run), DIR/curves.csv (accuracy over time,
# the evaluations every 0.5 s), DIR/clock-curves.csv (the evaluations every
# 100 clocks, which the steps to 0.85 are read from),
# DIR/summary.md (the tables) and DIR/accuracy.png (gnuplot), and replaces the
# section between the stragglers markers in bench/RESULTS.md with summary.md.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
reps=3 seconds=30 out="$root/bench/stragglers/out" quick=0 results=1 only_modes="" only_scenarios=""
report_only=0 no_compute=0 all_reps=0
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --quick) quick=1 reps=1 seconds=12; shift ;;
    --no-results) results=0; shift ;;
    --modes) only_modes=$2; shift 2 ;;
    --scenarios) only_scenarios=$2; shift 2 ;;
    --report-only) report_only=1; shift ;;
    --no-compute) no_compute=1; shift ;;
    --all-reps) all_reps=1; shift ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "stragglers: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
bin="${PACER_BUILD_DIR:-$root/build}"
[ -x "$bin/bench/pacer-sim" ] || { echo "stragglers: build first (deploy/setup.sh)" >&2; exit 1; }
command -v gnuplot >/dev/null || { echo "stragglers: gnuplot missing (deploy/setup.sh installs gnuplot-nox)" >&2; exit 1; }
mkdir -p "$out/runs"

# mode name -> local-cluster.sh flags, and the monitor flags it adds
declare -A mode_flags=(
  [bsp]="--policy fixed --mode bsp"
  [asp]="--policy fixed --mode asp"
  [ssp]="--policy fixed --mode ssp"
  [dssp]="--policy fixed --mode dssp"
  [backup]="--policy fixed --mode backup"
  [adaptive-batch]="--policy adaptive-batch --mode bsp"
  [pacer]="--policy pacer"
)
declare -A mode_monitor=([ssp]="--staleness=3" [backup]="--backup-workers=1")
# Test accuracy wanders by about 0.01-0.03 between evaluations near 0.85, so
# "the first evaluation at or above 0.85" comes sooner the more often one
# looks. Time to 0.85 is read from the evaluations every 0.5 s (as many per
# second in every run); steps to 0.85 from a second schedule, every
# $eval_clocks clocks (as many per step in every run). On the time schedule
# alone, a run whose steps are 1.7x quicker is looked at 1.7x less often per
# step, and its steps to 0.85 come out later for that reason alone.
eval_clocks=100
# Repetition r runs every mode with seed r (initial parameters, data order):
# modes are compared on the same draws, and BSP, whose steps do not depend
# on timing, is not the same trajectory in every repetition.
modes=(bsp asp ssp dssp backup adaptive-batch pacer)
# shellcheck disable=SC2206
[ -z "$only_modes" ] || modes=($only_modes)
wanted() { [ -z "$only_scenarios" ] || [[ " $only_scenarios " == *" $1 "* ]]; }
# scenario name -> per-worker flags in the array sargs (worker 2 is the straggler)
scenario_args() {
  case "$1" in
    none) sargs=() ;;
    slow) sargs=(--worker-args-2 "--slowdown 4") ;;
    moving) sargs=(--worker-args-2 "--slowdown-schedule 0:4,20:1,60:4"
                   --worker-args-0 "--slowdown-schedule 0:1,20:4,40:1"
                   --worker-args-1 "--slowdown-schedule 0:1,40:4,60:1") ;;
    contention) sargs=(--worker-args-2 "--cpu-contention 2 --pin-cpu 1") ;;
  esac
}

runs_csv="$out/runs.csv" curves_csv="$out/curves.csv" clock_curves_csv="$out/clock-curves.csv"
if [ "$report_only" -eq 0 ]; then
  # wait_wI, spp_wI (compute s per sample), comm_wI (communication s per
  # iteration): worker I in launch order (worker 2 is the straggler).
  echo "config,scenario,mode,rep,time_to_085,final_accuracy,samples_per_s,compute_s,communication_s,wait_s,wait_w0,wait_w1,wait_w2,clocks,seconds,spp_w0,spp_w1,spp_w2,comm_w0,comm_w1,comm_w2,clock_at_085" > "$runs_csv"
  echo "config,scenario,mode,rep,seconds,accuracy,clock" > "$curves_csv"
  echo "config,scenario,mode,rep,seconds,accuracy,clock" > "$clock_curves_csv"
fi

# run CONFIG BATCH SCENARIO MODE REP
run() {
  local config=$1 batch=$2 scenario=$3 mode=$4 rep=$5
  local dir="$out/runs/$config-$scenario-$mode-$rep"
  rm -rf "$dir"
  scenario_args "$scenario"
  # shellcheck disable=SC2086  # mode flags are word-split on purpose
  "$root/deploy/local-cluster.sh" --quiet --keep-training --out "$dir" --batch "$batch" \
    --time-cap "$seconds" ${mode_flags[$mode]} "${sargs[@]}" \
    --monitor-args "--seed=$rep --eval-every-clocks=$eval_clocks ${mode_monitor[$mode]:-}" > "$dir.txt" 2>&1 || true
  # Figures: monitor (accuracy), workers (summary lines).
  local ttt acc steps
  # Time: the first evaluation of the time schedule at or above 0.85.
  ttt=$(sed -n 's/.*clock [0-9]*: test accuracy \([0-9.]*\),.* after \([0-9.]*\) s$/\1 \2/p' "$dir/monitor.log" |
    awk '$1 >= 0.85 { print $2; exit }')
  acc=$(sed -n 's/^final test accuracy: //p' "$dir/monitor.out")
  # Steps (clocks): the first evaluation of the clock schedule at or above 0.85.
  steps=$(sed -n 's/.*clock \([0-9]*\) (every [0-9]* clocks): test accuracy \([0-9.]*\),.*/\1 \2/p' "$dir/monitor.log" |
    awk '$2 >= 0.85 { print $1; exit }')
  awk -v c="$config" -v s="$scenario" -v m="$mode" -v r="$rep" -v t="${ttt:-NA}" -v a="${acc:-NA}" \
      -v st="${steps:-NA}" '
    /worker summary:/ {
      for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
      idx = FILENAME; sub(/.*worker/, "", idx); sub(/\.out$/, "", idx)
      n++; samples += v["samples"]; secs += v["seconds"]; comp += v["compute_s"];
      comm += v["communication_s"]; wait += v["wait_s"]; w[idx] = v["wait_s"];
      spp[idx] = v["compute_s"] / (v["samples"] > 0 ? v["samples"] : 1)
      cpi[idx] = v["communication_s"] / (v["clocks"] > 0 ? v["clocks"] : 1)
      if (v["clocks"] > clocks) clocks = v["clocks"]
    }
    END {
      if (n == 0) { print c "," s "," m "," r "," t "," a ",NA,NA,NA,NA,NA,NA,NA,NA,NA,NA,NA,NA,NA,NA,NA," st; exit }
      printf "%s,%s,%s,%s,%s,%s,%.0f,%.3f,%.3f,%.3f,%s,%s,%s,%d,%.3f,%.9f,%.9f,%.9f,%.6f,%.6f,%.6f,%s\n",
             c, s, m, r, t, a, samples / (secs / n), comp, comm, wait, w[0], w[1], w[2], clocks,
             secs / n, spp[0], spp[1], spp[2], cpi[0], cpi[1], cpi[2], st
    }' "$dir"/worker*.out >> "$runs_csv"
  sed -n 's/.*clock \([0-9]*\): test accuracy \([0-9.]*\),.* after \([0-9.]*\) s$/\3 \2 \1/p' "$dir/monitor.log" |
    awk -v c="$config" -v s="$scenario" -v m="$mode" -v r="$rep" '{ print c "," s "," m "," r "," $1 "," $2 "," $3 }' >> "$curves_csv"
  sed -n 's/.*clock \([0-9]*\) (every [0-9]* clocks): test accuracy \([0-9.]*\),.* after \([0-9.]*\) s$/\3 \2 \1/p' "$dir/monitor.log" |
    awk -v c="$config" -v s="$scenario" -v m="$mode" -v r="$rep" '{ print c "," s "," m "," r "," $1 "," $2 "," $3 }' >> "$clock_curves_csv"
  echo "[stragglers] $config $scenario $mode #$rep: time to 0.85 ${ttt:-not reached} s, final ${acc:-?}" >&2
}

if [ "$report_only" -eq 0 ]; then
start=$(date +%s)
for rep in $(seq 1 "$reps"); do
  for scenario in none slow; do
    wanted "$scenario" || continue
    for mode in "${modes[@]}"; do run main 64 "$scenario" "$mode" "$rep"; done
  done
done
more_reps=1
[ "$all_reps" -eq 1 ] && more_reps=$reps
for rep in $(seq 1 "$more_reps"); do
  for scenario in moving contention; do
    wanted "$scenario" || continue
    for mode in "${modes[@]}"; do run main 64 "$scenario" "$mode" "$rep"; done
  done
done
if [ "$quick" -eq 0 ] && [ "$no_compute" -eq 0 ]; then
  for mode in bsp pacer; do run compute 1024 none "$mode" 1; done
  for mode in "${modes[@]}"; do run compute 1024 slow "$mode" 1; done
fi
echo $(( $(date +%s) - start )) > "$out/elapsed"
fi
elapsed=$(cat "$out/elapsed" 2>/dev/null || echo "?")
# Test accuracy is noisy near 0.85 (it wanders by about 0.01 between
# evaluations), so besides the first evaluation at or above 0.85 we report
# the first time the mean of three consecutive evaluations reaches it.
smoothed_csv="$out/smoothed.csv"
awk -F, 'NR > 1 {
    k = $1 "," $2 "," $3 "," $4
    if (!(k in seen)) { seen[k] = 1; order[++n] = k }
    i = ++len[k]; a[k, i] = $6; t[k, i] = $5
    if (i >= 3 && !(k in hit) && (a[k, i] + a[k, i - 1] + a[k, i - 2]) / 3 >= 0.85) hit[k] = t[k, i]
  }
  END { print "config,scenario,mode,rep,smoothed_time_to_085"
        for (j = 1; j <= n; j++) print order[j] "," ((order[j] in hit) ? hit[order[j]] : "NA") }' \
  "$curves_csv" > "$smoothed_csv"

# Calibration inputs, measured in the benchmark's own configuration (BSP, one
# 4x straggler, median over the runs): the two other workers' compute per sample and
# communication per iteration. The per-iteration compute overhead comes from
# the no-straggler BSP runs at batch 64 and 1024, when both ran.
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print "NA"; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
# Medians over the repetitions: one run's compute per sample can be 20% off
# on this shared machine.
calib_spp=$(awk -F, '$1 == "main" && $2 == "slow" && $3 == "bsp" && $7 != "NA" { printf "%.12f\n", ($16 + $17) / 2 }' "$runs_csv" | median)
calib_comm=$(awk -F, '$1 == "main" && $2 == "slow" && $3 == "bsp" && $7 != "NA" { printf "%.9f\n", ($19 + $20) / 2 }' "$runs_csv" | median)
calib=$(awk -F, -v spp="$calib_spp" -v comm="$calib_comm" '
  BEGIN { if (spp == "NA") spp = 0; if (comm == "NA") comm = 0 }
  $2 == "none" && $3 == "bsp" && $7 != "NA" { c[$1] += $8 / 3; k[$1] += $14 }
  END {
    ovh = 0
    if (k["main"] > 0 && k["compute"] > 0) {
      c64 = c["main"] / k["main"]; c1k = c["compute"] / k["compute"]
      s = (c1k - c64) / (1024 - 64); ovh = c64 - 64 * s
      if (ovh < 0) ovh = 0
      # Keep the measured per-sample time at batch 64, overhead included.
      spp = spp - ovh / 64; if (spp <= 0) { spp += ovh / 64; ovh = 0 }
    }
    printf "%.9f %.6f %.6f\n", spp, ovh, comm
  }' "$runs_csv")
read -r spp overhead comm <<< "$calib"

median() { sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print "NA"; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
# field CONFIG SCENARIO MODE COLUMN: the median of that column over the repetitions
field() {
  awk -F, -v c="$1" -v s="$2" -v m="$3" -v col="$4" '$1 == c && $2 == s && $3 == m && $col != "NA" { print $col }' "$runs_csv" | median
}
# time to 0.85, "NA" when a repetition never got there (then the median counts it as the cap)
ttt() {
  awk -F, -v c="$1" -v s="$2" -v m="$3" -v cap="$seconds" '$1 == c && $2 == s && $3 == m { print ($5 == "NA" ? cap + 1000 : $5) }' "$runs_csv" | median | awk -v cap="$seconds" '{ if ($1 == "NA" || $1 > cap) print "not reached"; else printf "%.2f\n", $1 }'
}

# The same from smoothed.csv.
tts() {
  awk -F, -v c="$1" -v s="$2" -v m="$3" -v cap="$seconds" 'NR > 1 && $1 == c && $2 == s && $3 == m { print ($5 == "NA" ? cap + 1000 : $5) }' "$smoothed_csv" | median | awk -v cap="$seconds" '{ if ($1 == "NA" || $1 > cap) print "not reached"; else printf "%.2f\n", $1 }'
}

summary="$out/summary.md"
{
  echo "<!-- stragglers:begin (written by bench/stragglers/run.sh; edits here are overwritten) -->"
  echo "Run of $(date -u +%Y-%m-%d) on $(nproc) cores ($(uname -m)), ${elapsed} s in all:"
  echo "\`bench/stragglers/run.sh --reps $reps --seconds $seconds\`. Each run trains for $seconds s;"
  echo "times to 0.85 and final accuracies are medians of $reps runs for *none* and *slow*,"
  echo "$([ "$all_reps" -eq 1 ] && echo "and (--all-reps) for *moving* and *contention* too." || echo "single runs otherwise.") Plot: \`$(realpath --relative-to="$root" "$out")/accuracy.png\`"
  echo "(test accuracy against wall time, one line per mode, the 4x-straggler scenario);"
  echo "per-run rows: \`runs.csv\`, curves: \`curves.csv\` in the same folder. *first*: the"
  echo "first evaluation at or above 0.85; *mean3*: the first time three consecutive"
  echo "evaluations average 0.85 (test accuracy wanders by about 0.01 between evaluations,"
  echo "so *first* is partly luck)."
  echo
  for config in main compute; do
    grep -q "^$config," "$runs_csv" || continue
    if [ "$config" = main ]; then
      echo "**Benchmark configuration** (batch 64 per worker, B = 192):"
    else
      echo "**Compute-bound configuration** (batch 1024 per worker, B = 3072):"
    fi
    echo
    t0=$(ttt "$config" none bsp)
    t0s=$(tts "$config" none bsp)
    read -r c m <<< "$(awk -F, -v k="$config" '$1 == k && $2 == "none" && $3 == "bsp" && $8 != "NA" {
      comp += $8; all += $8 + $9 + $10 } END { printf "%.3f %.3f\n", comp / all, 1 - comp / all }' "$runs_csv")"
    floor=$(awk -v t="$t0" -v c="$c" -v m="$m" 'BEGIN { printf "%.2f", t * (1.33 * c + m) }')
    floors=$(awk -v t="$t0s" -v c="$c" -v m="$m" 'BEGIN { printf "%.2f", t * (1.33 * c + m) }')
    bspbound=$(awk -v t="$t0" -v c="$c" -v m="$m" 'BEGIN { printf "%.2f", t * (4 * c + m) }')
    bspbounds=$(awk -v t="$t0s" -v c="$c" -v m="$m" 'BEGIN { printf "%.2f", t * (4 * c + m) }')
    echo "No-straggler BSP: T0 = $t0 s to 0.85 (first), $t0s s (mean3); compute share"
    echo "c = $c, communication and waiting m = $m (from the workers' own timings)."
    echo "Floor with one 4x straggler, T0 (1.33 c + m): $floor s (first), $floors s (mean3);"
    echo "BSP's expected T0 (4 c + m): $bspbound s (first), $bspbounds s (mean3)."
    echo
    scen=(none slow moving contention)
    [ "$config" = compute ] && scen=(none slow)
    printf "| mode |"; for s in "${scen[@]}"; do printf " %s: first (s) | mean3 (s) | final acc |" "$s"; done; echo
    printf "|---|"; for _ in "${scen[@]}"; do printf -- "---:|---:|---:|"; done; echo
    for mode in "${modes[@]}"; do
      printf "| %s |" "$mode"
      for s in "${scen[@]}"; do
        if grep -q "^$config,$s,$mode," "$runs_csv"; then
          printf " %s | %s | %s |" "$(ttt "$config" "$s" "$mode")" "$(tts "$config" "$s" "$mode")" \
            "$(field "$config" "$s" "$mode" 6 | awk '{ if ($1 == "NA") print "NA"; else printf "%.4f", $1 }')"
        else
          printf " – | – | – |"
        fi
      done
      echo
    done
    echo
    echo "Per-worker wait (s, whole run; worker 2 is the straggler) and throughput with the"
    echo "4x straggler:"
    echo
    echo "| mode | wait w0 | wait w1 | wait w2 | samples/s | to floor (first) | to floor (mean3) | to BSP none (mean3) |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|"
    for mode in "${modes[@]}"; do
      grep -q "^$config,slow,$mode," "$runs_csv" || continue
      t=$(ttt "$config" slow "$mode")
      ts=$(tts "$config" slow "$mode")
      ratio=$(awk -v t="$t" -v f="$floor" 'BEGIN { if (t ~ /not/ || f == 0) print "–"; else printf "%.2f", t / f }')
      ratios=$(awk -v t="$ts" -v f="$floors" 'BEGIN { if (t ~ /not/ || f == 0) print "–"; else printf "%.2f", t / f }')
      ratiob=$(awk -v t="$ts" -v f="$t0s" 'BEGIN { if (t ~ /not/ || f ~ /not/) print "–"; else printf "%.2f", t / f }')
      printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n" "$mode" "$(field "$config" slow "$mode" 11)" \
        "$(field "$config" slow "$mode" 12)" "$(field "$config" slow "$mode" 13)" \
        "$(field "$config" slow "$mode" 7)" "$ratio" "$ratios" "$ratiob"
    done
    echo
    # Steps: the time to 0.85 is (steps to 0.85) x (time per step). Steps
    # wander with SGD's noise from run to run; the time per step is what a
    # policy controls, and it is measured over the whole run, so it is steady.
    [ "$(awk -F, -v k="$config" '$1 == k && $22 != "" && $22 != "NA"' "$runs_csv" | wc -l)" -gt 0 ] || continue
    echo "Steps (clocks: B applied once) to the first evaluation at or above 0.85 of the"
    echo "schedule every $eval_clocks clocks (the times above use the one every 0.5 s), and time"
    echo "per step over the whole run (medians). With one 4x straggler the floor costs"
    echo "$(awk -v c="$c" -v m="$m" 'BEGIN { printf "%.2f", 1.33 * c + m }')x BSP's no-straggler time per step (1.33 c + m), BSP $(awk -v c="$c" -v m="$m" 'BEGIN { printf "%.2f", 4 * c + m }')x (4 c + m):"
    echo
    echo "| mode | none: steps | ms/step | slow: steps | ms/step | slow ms/step / BSP none ms/step |"
    echo "|---|---:|---:|---:|---:|---:|"
    bsp_ms=$(awk -F, -v k="$config" '$1 == k && $2 == "none" && $3 == "bsp" && $14 > 0 { print 1000 * $15 / $14 }' "$runs_csv" | median)
    for mode in "${modes[@]}"; do
      grep -q "^$config,slow,$mode,\|^$config,none,$mode," "$runs_csv" || continue
      row="| $mode |"
      for s in none slow; do
        st=$(field "$config" "$s" "$mode" 22)
        ms=$(awk -F, -v k="$config" -v s="$s" -v m="$mode" '$1 == k && $2 == s && $3 == m && $14 > 0 { print 1000 * $15 / $14 }' "$runs_csv" | median)
        row+=" $(awk -v x="$st" 'BEGIN { if (x == "NA") print "–"; else printf "%.0f", x }') | $(awk -v x="$ms" 'BEGIN { if (x == "NA") print "–"; else printf "%.2f", x }') |"
        [ "$s" = slow ] && slow_ms=$ms
      done
      row+=" $(awk -v a="$slow_ms" -v b="$bsp_ms" 'BEGIN { if (a == "NA" || b == "NA" || b == 0) print "–"; else printf "%.2f", a / b }') |"
      echo "$row"
    done
    echo
  done
  echo "**Simulator calibration** (bench/cluster_sim.h; inputs measured in the BSP runs with"
  echo "the straggler, on the other two workers, medians over the runs: $(awk -v s="$spp" 'BEGIN { printf "%.1f", s * 1e6 }') µs compute per sample, $(awk -v s="$overhead" 'BEGIN { printf "%.2f", s * 1e3 }') ms per-iteration"
  echo "overhead, $(awk -v s="$comm" 'BEGIN { printf "%.2f", s * 1e3 }') ms communication per iteration), 3 workers, one 4x straggler:"
  echo
  echo "| mode | measured samples/s | simulated samples/s | simulated / measured |"
  echo "|---|---:|---:|---:|"
  for mode in "${modes[@]}"; do
    read -r policy cmode extra <<< "$(case $mode in
      bsp) echo "fixed bsp" ;; asp) echo "fixed asp" ;; ssp) echo "fixed ssp --staleness=3" ;;
      dssp) echo "fixed dssp" ;; backup) echo "fixed backup --backup-workers=1" ;;
      adaptive-batch) echo "adaptive-batch bsp" ;; pacer) echo "pacer dssp" ;; esac)"
    # shellcheck disable=SC2086
    sim=$("$bin/bench/pacer-sim" --workers 3 --scenario static --slow-factor 4 --batch 64 \
      --mode "$cmode" --policy "$policy" $extra --seconds-per-sample "$spp" \
      --iteration-overhead "$overhead" --communication "$comm" --seconds "$seconds" \
      --policy-interval 0.25 --csv | cut -d, -f5)
    meas=$(field main slow "$mode" 7)
    printf "| %s | %s | %.0f | %s |\n" "$mode" "$meas" "$sim" \
      "$(awk -v a="$sim" -v b="$meas" 'BEGIN { if (b == "NA" || b == 0) print "–"; else printf "%.2f", a / b }')"
  done
  echo
  echo "<!-- stragglers:end -->"
} > "$summary"

# The plot: accuracy over time in the 4x-straggler scenario, first repetition.
plot_cmds=""
for mode in "${modes[@]}"; do
  awk -F, -v m="$mode" '$1 == "main" && $2 == "slow" && $3 == m && $4 == 1 { print $5, $6 }' "$curves_csv" > "$out/curve-$mode.dat"
  plot_cmds+="${plot_cmds:+, }'$out/curve-$mode.dat' using 1:2 with lines lw 2 title '$mode'"
done
gnuplot <<EOF
set terminal pngcairo size 1000,600 noenhanced
set output '$out/accuracy.png'
set title 'Fashion-MNIST, 2 shards, 3 workers, one 4x straggler'
set xlabel 'wall time (s)'
set ylabel 'test accuracy'
set yrange [0.6:0.9]
set grid
set key bottom right
plot $plot_cmds, 0.85 with lines dt 2 lc rgb 'gray' title '0.85'
EOF

cat "$summary"
if [ "$results" -eq 1 ]; then
  "$root/bench/stragglers/put-section.py" "$root/bench/RESULTS.md" stragglers \
    "Stragglers (bench/stragglers)" "$summary"
  echo "[stragglers] bench/RESULTS.md updated" >&2
fi
