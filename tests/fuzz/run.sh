#!/usr/bin/env bash
# The fuzz targets (tests/fuzz/*_fuzz.cc): builds them with clang and
# libFuzzer in build-fuzz/ (-DPACER_FUZZ=ON: ASan, UBSan and coverage on
# every library), then runs each on a copy of its seed corpus
# (tests/fuzz/corpus/TARGET) for S seconds. A crash, leak or sanitizer
# report fails the run and leaves the input that caused it in
# build-fuzz/fuzz-out/TARGET/. Exit 77 (skipped) without clang or
# libclang-rt-14-dev.
#
#   tests/fuzz/run.sh [--seconds S] [--targets "T ..."] [--seeds]
#   --seeds  rewrite the seed corpus from valid inputs (make_seeds) first
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
seconds=10 seeds=0 targets="frame_fuzz checkpoint_fuzz scenario_fuzz config_fuzz"
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --targets) targets=$2; shift 2 ;;
    --seeds) seeds=1; shift ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fuzz: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$seconds" in
  ''|*[!0-9]*|0*) echo "fuzz: --seconds needs a whole number above 0, not '$seconds'" >&2; exit 2 ;;
esac
# Skipped unless this clang++ links a fuzzer (its own libclang-rt).
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
if ! command -v clang++ >/dev/null 2>&1 ||
   ! echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' |
     clang++ -x c++ -fsanitize=fuzzer - -o "$probe/probe" >/dev/null 2>&1; then
  echo "SKIP: clang++ cannot build a libFuzzer target (Debian: clang, libclang-rt-14-dev; deploy/setup.sh installs them)"
  exit 77
fi
build="$root/build-fuzz"
# Configured every time (cheap when nothing changed), so changed flags apply.
# -O1 and line tables only: the usual flags for fuzzing, and half the
# compile time of -O2 -g.
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DPACER_FUZZ=ON \
  -DPACER_BUILD_TESTS=OFF -DPACER_BUILD_BENCH=OFF -DPACER_ENABLE_CUDA=OFF > "$build.cmake.log" 2>&1 ||
  { cat "$build.cmake.log"; echo "fuzz: configuring build-fuzz failed" >&2; exit 1; }
# shellcheck disable=SC2086  # the target list is word-split on purpose
cmake --build "$build" -j 2 --target $targets $([ "$seeds" -eq 1 ] && echo make_seeds) > "$build/fuzz-build.log" 2>&1 ||
  { tail -40 "$build/fuzz-build.log"; echo "fuzz: building the targets failed" >&2; exit 1; }
if [ "$seeds" -eq 1 ]; then "$build/tests/fuzz/make_seeds" "$root"; fi
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
status=0
for t in $targets; do
  out="$build/fuzz-out/$t"
  rm -rf "$out"
  mkdir -p "$out/corpus"
  cp -r "$root/tests/fuzz/corpus/$t/." "$out/corpus/" 2>/dev/null || true
  if (cd "$out" && "$build/tests/fuzz/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 corpus > log 2>&1); then
    echo "$t: $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$out/log" | grep -o '[0-9]*$') runs in ${seconds} s, no crash"
  else
    echo "$t: FAILED (log and the crashing input in $out):" >&2
    grep -E "ERROR|SUMMARY|Test unit written" "$out/log" | head -10 >&2
    status=1
  fi
done
exit $status
