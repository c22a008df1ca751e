#!/usr/bin/env bash
# Runs Pacer's whole test suite: set-up (packages + build), then ctest, then a
# short run of each fuzz target (tests/fuzz/run.sh: where clang and libFuzzer
# are installed; skipped with a message where not).
#
#   tests/run.sh [CTEST ARGS]             build/ (Release); with ctest
#                                         arguments (e.g. -L unit, -LE chaos)
#                                         only those tests, and no fuzzing
#   tests/run.sh --sanitize [CTEST ARGS]  the suite under AddressSanitizer and
#                                         UndefinedBehaviorSanitizer
#                                         (build-sanitize/)
#   tests/run.sh --tsan [CTEST ARGS]      the concurrency tests (ctest label
#                                         concurrency: the transport's, the
#                                         client's and the in-process
#                                         cluster's threads) under
#                                         ThreadSanitizer (build-tsan/; only
#                                         what they need is built, unless
#                                         ctest arguments choose tests)
#
# Under a sanitizer the first report fails its test (halt_on_error); every
# process a cluster test starts is built the same way.
# PACER_FUZZ_SECONDS sets the fuzz run per target (default 10; 0: none).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mode=release
case "${1:-}" in
  --sanitize) mode=sanitize; shift ;;
  --tsan) mode=tsan; shift ;;
  -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
ctest_args=("$@")

case "$mode" in
  release)
    "$root/deploy/setup.sh"
    build="$root/build" ;;
  sanitize)
    "$root/deploy/setup.sh" --sanitize
    build="$root/build-sanitize"
    export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
    export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
    export LSAN_OPTIONS="suppressions=$root/tests/sanitizers/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}" ;;
  tsan)
    if [ ${#ctest_args[@]} -eq 0 ]; then
      ctest_args=(-L concurrency)
      "$root/deploy/setup.sh" --tsan --target client_test --target security_test \
        --target inproc_cluster_test
    else
      "$root/deploy/setup.sh" --tsan
    fi
    build="$root/build-tsan"
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$root/tests/sanitizers/tsan.supp${TSAN_OPTIONS:+:$TSAN_OPTIONS}" ;;
esac

cd "$build"
# Up to two chaos scenarios and one other test at a time (the resource groups
# of tests/CMakeLists.txt, limited by tests/ctest_resources.json); under a
# sanitizer one at a time. A -j among the ctest arguments comes later and
# wins.
jobs=()
[ "$mode" = release ] && jobs=(-j 3 --resource-spec-file "$root/tests/ctest_resources.json")
ctest --output-on-failure --no-tests=error ${jobs[@]+"${jobs[@]}"} ${ctest_args[@]+"${ctest_args[@]}"}

# The whole suite also runs the fuzz targets for a bounded time.
seconds=${PACER_FUZZ_SECONDS:-10}
case "$seconds" in
  ''|*[!0-9]*) echo "run.sh: PACER_FUZZ_SECONDS must be a whole number, not '$seconds'" >&2; exit 2 ;;
esac
if [ "$mode" = release ] && [ ${#ctest_args[@]} -eq 0 ] && [ "$((10#$seconds))" -gt 0 ]; then
  status=0
  "$root/tests/fuzz/run.sh" --seconds "$((10#$seconds))" || status=$?
  if [ "$status" -eq 77 ]; then
    echo "fuzz: skipped (no clang or libFuzzer)"
  elif [ "$status" -ne 0 ]; then
    exit "$status"
  fi
fi
