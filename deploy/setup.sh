#!/usr/bin/env bash
# Pacer set-up: installs the Debian 12 packages Pacer needs (only when some are
# missing), then configures and builds with CMake + Ninja.
#
#   deploy/setup.sh             Release build into build/
#   deploy/setup.sh --debug     Debug build into build-debug/
#   deploy/setup.sh --sanitize  ASan + UBSan build into build-sanitize/
#   deploy/setup.sh --tsan      ThreadSanitizer build into build-tsan/
#                               (sanitizer builds: no CUDA, no benchmarks)
#   deploy/setup.sh --no-cuda   never build the CUDA backend
#   deploy/setup.sh --deps-only install packages, do not build
#   deploy/setup.sh --target T  build only target T (repeatable)
#
# Idempotent: a second run installs nothing and rebuilds only what changed.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_type=Release
build_dir="$root/build"
sanitize=OFF
tsan=OFF
bench=ON
cuda=ON
deps_only=0
targets=()
while [ $# -gt 0 ]; do
  arg=$1
  shift
  case "$arg" in
    --target) [ $# -gt 0 ] || { echo "setup.sh: --target needs a name" >&2; exit 2; }
              targets+=(--target "$1"); shift ;;
    --debug) build_type=Debug; build_dir="$root/build-debug" ;;
    --sanitize) build_type=RelWithDebInfo; sanitize=ON; build_dir="$root/build-sanitize" ;;
    --tsan) build_type=RelWithDebInfo; tsan=ON; build_dir="$root/build-tsan" ;;
    --no-cuda) cuda=OFF ;;
    --deps-only) deps_only=1 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup.sh: unknown option '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

# Why each package is here:
#  build tools; ZeroMQ + cppzmq (transport); flatbuffers + flatc (wire schema);
#  RocksDB (checkpoints); prometheus-cpp (metrics); zlib (IDX .gz, and the
#  reference CRC-32); ISA-L (the same CRC-32, 3x faster, for checkpoint and
#  model files); libxxhash (XXH3, the message checks: ps/base/wire.h);
#  Eigen + OpenBLAS (CPU compute: Eigen expressions, OpenBLAS GEMM, never the
#  reference libblas3); CLI11 (flags); spdlog (logs); abseil (Status/StatusOr);
#  GoogleTest/GoogleMock/Benchmark (tests, bench); the Fashion-MNIST data set;
#  gnuplot-nox (bench/stragglers draws its accuracy-over-time plot with it);
#  stress-ng (bench/stragglers/stability.sh: the co-located load);
#  nlohmann-json3-dev (pacerctl's stable JSON output); libyaml-cpp-dev
#  (pacer-chaos's scenario files); prometheus (tests: its
#  promtool checks every process's /metrics and the rules, and a real server
#  scrapes a test cluster); pybind11-dev + python3-dev (the pacer._core
#  module), python3-numpy, python3-torch and python3-pytest (the `pacer`
#  Python package and its tests, run with /usr/bin/python3).
packages=(
  build-essential cmake ninja-build pkg-config
  libzmq3-dev cppzmq-dev libflatbuffers-dev flatbuffers-compiler
  librocksdb-dev prometheus-cpp-dev zlib1g-dev libisal-dev libxxhash-dev
  libeigen3-dev libopenblas-dev libcli11-dev libspdlog-dev libabsl-dev
  libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev libyaml-cpp-dev
  dataset-fashion-mnist gnuplot-nox stress-ng
  pybind11-dev python3-dev python3-numpy python3-torch python3-pytest
)
# Wanted, not required: where it cannot be installed, the tests that need
# it skip with a message.
# iproute2 + iptables: pacer-chaos --netns (network namespaces, partitions
# made by the kernel). clang + libclang-rt-14-dev: the libFuzzer targets
# (tests/fuzz/run.sh, which skips without them).
optional_packages=(prometheus iproute2 iptables clang libclang-rt-14-dev)

# Node.js runs the offline Kubernetes manifest checks (tests/deploy/k8s_test.sh);
# Debian's nodejs + npm only where no node is installed already.
command -v node >/dev/null 2>&1 || packages+=(nodejs npm)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${#missing[@]} missing Debian package(s): ${missing[*]}" >&2
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      SUDO=(sudo -n)
    else
      echo "setup: need root to install: ${missing[*]}" >&2
      echo "setup: run as root, or: sudo apt-get install -y ${missing[*]}" >&2
      exit 1
    fi
  else
    SUDO=()
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update -q
  "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all Debian packages present" >&2
fi
for p in "${optional_packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    echo "setup: installing optional package $p" >&2
    SUDO=()
    if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      SUDO=(sudo -n)
    fi
    if ! DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -q --no-install-recommends "$p" >&2; then
      echo "setup: could not install $p; the tests that need it will skip" >&2
    fi
  fi
done

# The manifest validator, pinned in tests/k8s/package-lock.json.
if command -v npm >/dev/null 2>&1 &&
   { [ ! -d "$root/tests/k8s/node_modules" ] ||
     [ "$root/tests/k8s/package-lock.json" -nt "$root/tests/k8s/node_modules" ]; }; then
  echo "setup: installing the pinned manifest validator (npm ci in tests/k8s)" >&2
  (cd "$root/tests/k8s" && npm ci --no-audit --no-fund >&2 && touch node_modules)
fi

[ "$deps_only" -eq 1 ] && exit 0

werror=OFF
[ "${CI:-}" = "true" ] && werror=ON
# The sanitizers watch host code; CUDA's device memory is compute-sanitizer's.
if [ "$sanitize" = ON ] || [ "$tsan" = ON ]; then cuda=OFF bench=OFF; fi

jobs=${PACER_BUILD_JOBS:-$(nproc)}
cmake -S "$root" -B "$build_dir" -G Ninja \
  -DCMAKE_BUILD_TYPE="$build_type" \
  -DPACER_SANITIZE="$sanitize" \
  -DPACER_TSAN="$tsan" \
  -DPACER_BUILD_BENCH="$bench" \
  -DPACER_WERROR="$werror" \
  -DPACER_ENABLE_CUDA="$cuda" >&2
cmake --build "$build_dir" -j "$jobs" ${targets[@]+"${targets[@]}"} >&2
echo "setup: built into $build_dir" >&2
