#!/usr/bin/env bash
# Runs Pacer's whole test suite: set-up (packages + build), then ctest.
# Extra arguments go to ctest, e.g. `tests/run.sh -L unit` or `-LE cluster`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/deploy/setup.sh"
cd "$root/build"
ctest --output-on-failure --no-tests=error "$@"
