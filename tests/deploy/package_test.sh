#!/usr/bin/env bash
# The Debian package: builds it with CPack from the build directory ($1),
# checks its contents and conffiles with dpkg-deb, builds and runs the
# example program against the unpacked package (find_package(Pacer)), and
# runs `systemd-analyze verify` on its units where that command exists.
set -euo pipefail
build=$(cd "${1:?usage: package_test.sh BUILD_DIR}" && pwd)
for tool in cpack dpkg-deb; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "SKIP: $tool not found"
    exit 77
  fi
done
# A sanitizer build is for finding bugs, not for shipping: its static
# libraries need the sanitizer runtime that the example's link would lack.
if grep -qE '^PACER_(SANITIZE|TSAN):BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "SKIP: $build is a sanitizer build (packages come from a plain one)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

(cd "$build" && cpack -G DEB -B "$tmp/out" >"$tmp/cpack.log" 2>&1) || { cat "$tmp/cpack.log"; fail "cpack"; }
deb=$(ls "$tmp"/out/pacer_*.deb)
echo "built $(basename "$deb")"
pydeb=$(ls "$tmp"/out/python3-pacer_*.deb 2>/dev/null || true)

dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|' > "$tmp/contents"
for path in /usr/bin/pacer-server /usr/bin/pacer-monitor /usr/bin/pacer-worker /usr/bin/pacerctl \
    /usr/bin/pacer-run \
    /usr/lib/systemd/system/pacer-monitor.service /usr/lib/systemd/system/pacer-server@.service \
    /usr/lib/systemd/system/pacer-worker@.service \
    /etc/pacer/monitor.toml /etc/pacer/server.toml /etc/pacer/worker.toml \
    /usr/include/pacer/ps/client.h /usr/include/pacer/ps/pacer_generated.h \
    /usr/include/pacer/worker/worker.h \
    /usr/lib/libpacer_ps.a /usr/lib/libpacer_worker.a \
    /usr/lib/cmake/Pacer/PacerConfig.cmake /usr/lib/cmake/Pacer/PacerConfigVersion.cmake \
    /usr/lib/cmake/Pacer/PacerTargets.cmake \
    /usr/share/pacer/grafana/pacer-dashboard.json /usr/share/pacer/prometheus/pacer.rules.yml \
    /usr/share/doc/pacer/RUNBOOKS.md /usr/share/doc/pacer/example/train_logistic.cc \
    /usr/share/doc/pacer/README.md /usr/share/doc/pacer/deploy/README.md \
    /usr/share/doc/pacer/monitor/README.md /usr/share/doc/pacer/ps/README.md \
    /usr/share/doc/pacer/example/blobs.csv \
    /usr/share/pacer/make-keys.sh; do
  grep -qx "$path" "$tmp/contents" || fail "the package lacks $path"
done
# Nothing outside the FHS places above (no build paths, no /usr/local).
if grep -vE '^/(etc/pacer|usr/(bin|include/pacer|lib|share))(/|$)|^/(etc|usr|usr/include)/$' "$tmp/contents"; then
  fail "unexpected paths in the package (above)"
fi
dpkg-deb -I "$deb" conffiles > "$tmp/conffiles" || fail "no conffiles in the package"
for c in monitor server worker; do
  grep -qx "/etc/pacer/$c.toml" "$tmp/conffiles" || fail "/etc/pacer/$c.toml is not a conffile"
done
dpkg-deb -f "$deb" Depends | grep -q librocksdb || fail "Depends lacks the run-time libraries"
echo "contents: ok"

# The example program, against the unpacked package only.
dpkg-deb -x "$deb" "$tmp/root"
cmake -S "$tmp/root/usr/share/doc/pacer/example" -B "$tmp/example" -G Ninja \
  -DCMAKE_PREFIX_PATH="$tmp/root/usr" -DCMAKE_BUILD_TYPE=Release >"$tmp/example.log" 2>&1 ||
  { cat "$tmp/example.log"; fail "configuring the example"; }
cmake --build "$tmp/example" -j 2 >>"$tmp/example.log" 2>&1 ||
  { cat "$tmp/example.log"; fail "building the example"; }
grep -q "$tmp/root/usr/include/pacer" "$tmp/example/build.ninja" ||
  fail "the example did not use the package's headers"
set +e
"$tmp/example/train_logistic" > "$tmp/run.log" 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "usage:" "$tmp/run.log" || { cat "$tmp/run.log"; fail "the example does not run"; }
# ... and trains its own model in a job of the packaged binaries: one
# shard, the example as the only worker, stopped by the monitor once the
# example's own evaluation reports 0.9 (the blobs' best is about 0.93).
bin=$tmp/root/usr/bin
address_of() {
  for _ in $(seq 1 200); do
    a=$(sed -n "s/^listening //p" "$1" 2>/dev/null | head -n 1)
    [ -n "$a" ] && { echo "$a"; return 0; }
    sleep 0.05
  done
  cat "$1"; fail "no 'listening' line in $1"
}
timeout 60 "$bin/pacer-monitor" --listen tcp://127.0.0.1:0 --metrics-addr off --min-shards 1 \
  --min-workers 1 --global-batch 32 --target-accuracy 0.9 --time-cap 40 --eval-interval 0.3 \
  > "$tmp/job-monitor.out" 2> "$tmp/job-monitor.log" &
monitor_pid=$!
monitor=$(address_of "$tmp/job-monitor.out")
timeout 60 "$bin/pacer-server" --listen tcp://127.0.0.1:0 --monitor "$monitor" --metrics-addr off \
  > "$tmp/job-shard.out" 2> "$tmp/job-shard.log" &
shard_pid=$!
set +e
timeout 60 "$tmp/example/train_logistic" "$monitor" \
  "$tmp/root/usr/share/doc/pacer/example/blobs.csv" > "$tmp/job-example.log" 2>&1
rc=$?
wait "$monitor_pid" "$shard_pid"
set -e
if [ "$rc" -ne 0 ] || ! grep -q "target accuracy" "$tmp/job-example.log"; then
  cat "$tmp/job-example.log" "$tmp/job-monitor.log"
  fail "the example did not train its model to the monitor's target (exit $rc)"
fi
echo "example: builds against the package and trains its own model in a job: $(tail -n 1 "$tmp/job-example.log")"

# python3-pacer (where the build has the Python module): pacer._core and
# pacer.torch in Debian's dist-packages, depending on python3-torch, so
# that the pacer package need not; once unpacked, Debian's Python imports
# it and trains with it.
if grep -q '^pybind11_DIR:PATH=/' "$build/CMakeCache.txt"; then
  [ -n "$pydeb" ] || fail "cpack built no python3-pacer package"
  dpkg-deb -c "$pydeb" | awk '{print $6}' | sed 's|^\./|/|' > "$tmp/pycontents"
  for path in /usr/lib/python3/dist-packages/pacer/__init__.py \
      /usr/lib/python3/dist-packages/pacer/torch/__init__.py \
      /usr/lib/python3/dist-packages/pacer/torch/_optim.py \
      /usr/share/doc/python3-pacer/examples/train_fashion.py; do
    grep -qx "$path" "$tmp/pycontents" || fail "python3-pacer lacks $path"
  done
  grep -q '^/usr/lib/python3/dist-packages/pacer/_core\.cpython-.*\.so$' "$tmp/pycontents" ||
    fail "python3-pacer lacks the pacer._core module"
  dpkg-deb -f "$pydeb" Depends | grep -q 'python3-torch' || fail "python3-pacer does not depend on python3-torch"
  if dpkg-deb -f "$deb" Depends | grep -q 'python3-torch'; then fail "pacer depends on python3-torch"; fi
  grep -q '^/usr/lib/python3' "$tmp/contents" && fail "the pacer package holds Python files"
  dpkg-deb -x "$pydeb" "$tmp/pyroot"
  (cd "$tmp" && PYTHONPATH="$tmp/pyroot/usr/lib/python3/dist-packages" /usr/bin/python3 -c \
    "import pacer.torch, pacer._core, os; assert pacer.__file__.startswith('$tmp/pyroot'), pacer.__file__") \
    > "$tmp/pyimport.log" 2>&1 || { cat "$tmp/pyimport.log"; fail "the packaged pacer.torch does not import"; }
  echo "python3-pacer: contents and dependencies ok; /usr/bin/python3 imports pacer.torch from it"
else
  echo "python3-pacer: not built here (no pybind11), not checked"
fi

# Transport security is on by default in the packaged settings: the units
# load each process's key as a credential, the configs name the allowed
# keys, and the packaged make-keys.sh writes both; a monitor with them
# runs under CURVE.
grep -q '^allowed-keys = "/etc/pacer/keys/allowed"' "$tmp/root/etc/pacer/worker.toml" ||
  fail "worker.toml does not name the allowed keys"
grep -q '^LoadCredential=pacer.key:/etc/pacer/keys/server-%i.key' \
  "$tmp/root/usr/lib/systemd/system/pacer-server@.service" || fail "pacer-server@ loads no key"
"$tmp/root/usr/share/pacer/make-keys.sh" "$tmp/keys" --shards 1 --workers 1 \
  --pacerctl "$tmp/root/usr/bin/pacerctl" > "$tmp/keys.log" 2>&1 || { cat "$tmp/keys.log"; fail "make-keys.sh"; }
[ "$(stat -c %a "$tmp/keys/monitor.key")" = 600 ] || fail "monitor.key is not mode 600"
[ "$(grep -c . "$tmp/keys/allowed")" = 4 ] && grep -q '^monitor ' "$tmp/keys/allowed" &&
  grep -q '^operator ' "$tmp/keys/allowed" ||
  { cat "$tmp/keys/allowed"; fail "make-keys.sh wrote no allowed list of 4 named keys"; }
[ -f "$tmp/keys/operator/operator.key" ] && [ ! -e "$tmp/keys/operator.key" ] ||
  fail "the operator key is not kept apart from the cluster's keys"
set +e
timeout 3 "$tmp/root/usr/bin/pacer-monitor" --listen tcp://127.0.0.1:0 --metrics-addr off \
  --key "$tmp/keys/monitor.key" --allowed-keys "$tmp/keys/allowed" > "$tmp/monitor.log" 2>&1
set -e
grep -q "transport security: CURVE.*1 operator key" "$tmp/monitor.log" ||
  { cat "$tmp/monitor.log"; fail "the monitor did not run under CURVE with the operator key"; }
echo "security: keys made by the packaged make-keys.sh, the monitor runs under CURVE"

# The CUDA backend module, when nvcc built one: installed where the packaged
# pacer-worker finds it (../lib/pacer), which a --device cuda run shows: it
# gets past loading the module to the CUDA runtime (here, without a GPU,
# that says why there is no device).
if [ -e "$build/worker/libpacer_cuda.so" ]; then
  grep -qx /usr/lib/pacer/libpacer_cuda.so "$tmp/contents" || fail "the package lacks libpacer_cuda.so"
  set +e
  PACER_CUDA_MODULE= timeout 60 "$tmp/root/usr/bin/pacer-worker" --monitor tcp://127.0.0.1:9 \
    --device cuda --train-limit 10 --test-limit 10 --start-timeout 1 > "$tmp/cuda.log" 2>&1
  set -e
  # Past the module: the CUDA runtime's own answer (no device here), or the
  # backend made (a machine with a GPU).
  if ! grep -Eq "no CUDA device|no usable CUDA device| on cuda " "$tmp/cuda.log"; then
    cat "$tmp/cuda.log"
    fail "the packaged pacer-worker did not load the packaged CUDA module"
  fi
  echo "cuda module: installed and found by the packaged pacer-worker"
fi

if command -v systemd-analyze >/dev/null 2>&1; then
  units=("$tmp"/root/usr/lib/systemd/system/*.service)
  # The targets the units order against come from the host's systemd.
  for t in /lib/systemd/system/*.target; do
    [ -e "$tmp/root/usr/lib/systemd/system/$(basename "$t")" ] ||
      cp "$t" "$tmp/root/usr/lib/systemd/system/"
  done
  # Template units are verified through an instance.
  cp "$tmp/root/usr/lib/systemd/system/pacer-server@.service" "$tmp/root/usr/lib/systemd/system/pacer-server@0.service"
  cp "$tmp/root/usr/lib/systemd/system/pacer-worker@.service" "$tmp/root/usr/lib/systemd/system/pacer-worker@0.service"
  systemd-analyze verify --root="$tmp/root" "$tmp/root/usr/lib/systemd/system/pacer-monitor.service" \
    "$tmp/root/usr/lib/systemd/system/pacer-server@0.service" \
    "$tmp/root/usr/lib/systemd/system/pacer-worker@0.service" > "$tmp/verify.log" 2>&1 ||
    { cat "$tmp/verify.log"; fail "systemd-analyze verify"; }
  if grep -v "^$" "$tmp/verify.log"; then fail "systemd-analyze verify warned (above)"; fi
  echo "systemd units: verified (${#units[@]} unit files)"
else
  echo "systemd-analyze not found: units not verified"
fi
echo "package: ok"
