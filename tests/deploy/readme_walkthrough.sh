#!/usr/bin/env bash
# The READMEs' commands, run as a new user would type them, taken from the
# READMEs themselves (so that a change to either shows here):
#  1. the top README's Quick start example (deploy/quickstart.sh ...
#     --compare), with --skip-setup added (the suite has set up and built
#     already);
#  2. deploy/README.md's "Running a cluster by hand": its three commands,
#     each line run as many times as its comment says ("# twice", "# three
#     times"), in the background, with the monitor's port 5555 replaced by
#     a free one;
#  3. monitor/README.md's "pacerctl" block against that cluster, line by
#     line in one shell (its export holds for the lines after it; a line
#     ending in & runs in the background), with ID replaced by a real id: a
#     by-hand worker's for remove-worker, the idle shard's (started by the
#     block) otherwise;
#  4. README.md's PyTorch command ("Train your own model": pacer-run ...
#     train.py) with the example script as train.py and a 12 s time cap.
# Every command must succeed, and what they print must say what the READMEs
# say it does. Every process it starts is stopped at exit.
#   tests/deploy/readme_walkthrough.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
work=$(mktemp -d -t pacer-walkthrough.XXXXXX)
pids=()
cleanup() {
  # SIGTERM stops each process cleanly (deploy/README.md says so): workers first,
  # then shards, then the monitor; whatever is left after 15 s is killed.
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2>/dev/null || true; done
  for _ in $(seq 1 150); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" -eq 0 ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null && echo "killed $p: SIGTERM did not stop it" >&2; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# block FILE HEADING N: the N-th ```sh block (from 1) under "## HEADING" of
# FILE (relative to the source tree), its continuation lines joined.
block() {
  [ -f "$root/$1" ] || fail "no $1"
  grep -qx "## $2" "$root/$1" || fail "$1 has no section '## $2'"
  awk -v h="## $2" -v n="$3" '
    $0 == h { in_section = 1; next }
    in_section && /^## / { exit }
    in_section && /^```sh$/ { k++; in_block = (k == n); next }
    in_block && /^```$/ { exit }
    in_block { if (sub(/\\$/, "")) { acc = acc $0; next } print acc $0; acc = "" }
  ' "$root/$1"
}

# 1. The Quick start's example, as written (plus --skip-setup).
example=$(block README.md "Quick start" 2)
[[ $example == deploy/quickstart.sh* ]] || fail "no deploy/quickstart.sh example in the Quick start: '$example'"
echo "== $example --skip-setup"
cd "$root"
rc=0
eval "$example --skip-setup" > "$work/quickstart.out" 2> "$work/quickstart.err" || rc=$?
[ "$rc" -eq 0 ] || { tail -30 "$work/quickstart.err" >&2; fail "the Quick start example exited $rc"; }
cat "$work/quickstart.out"
grep -q '^time to 0.85: [0-9.]* s$' "$work/quickstart.out" || fail "no 'time to 0.85' line"
grep -q '^time to 0.85 under BSP: ' "$work/quickstart.out" || fail "--compare printed no BSP time"
grep -q 'policy / BSP time to the target: [0-9.]*$' "$work/quickstart.out" || fail "--compare printed no ratio"
# The table: the straggler (launch index 2) has the smallest share of B.
table=$(grep -A4 '^\[pacer-run\] worker *exit *mean batch' "$work/quickstart.err" | head -4) ||
  fail "no per-worker table at the end"
echo "$table"
# [pacer-run] worker ID rank R  exit  mean  share%  ...: the rows in launch order.
share() { sed -n "$(( $1 + 2 ))p" <<< "$table" | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /%$/) { sub(/%/, "", $i); print $i; exit } }'; }
s0=$(share 0) s1=$(share 1) s2=$(share 2)
[ -n "$s2" ] || fail "no share of B for the straggler in the table"
# Each worker asked for its launch index as its rank (PACER_RANK) and got it.
for i in 0 1 2; do
  sed -n "$((i + 2))p" <<< "$table" | grep -q "^\[pacer-run\] worker [0-9]* rank $i " ||
    fail "the worker of launch index $i is not rank $i: $(sed -n "$((i + 2))p" <<< "$table")"
done
awk -v a="$s0" -v b="$s1" -v c="$s2" 'BEGIN { exit !(c < a / 2 && c < b / 2) }' ||
  fail "the 4x straggler's share of B ($s2%) is not under half the others' ($s0%, $s1%)"
grep -q 'pacer policy: [0-9]* rounds' "$work/quickstart.err" || fail "no line on what the policy did"
# The launcher's prefixes: ids once known, launch indexes before.
grep -q '^\[worker [0-9]* rank [0-9]*\] ' "$work/quickstart.err" || fail "no [worker ID rank R] prefix"
grep -q '^\[shard [0-9]*\] ' "$work/quickstart.err" || fail "no [shard ID] prefix"
# The plain-mode warning: once, from the launcher, not from each process.
[ "$(grep -c '^\[pacer-run\] plain ZeroMQ' "$work/quickstart.err")" -eq 1 ] &&
  ! grep -q 'transport security is off' "$work/quickstart.err" ||
  fail "the plain-mode warning is not shown exactly once for the cluster"

# 2. A cluster by hand.
# A port nothing listens on (a connect to it fails).
port=0
for _ in $(seq 1 50); do
  p=$((20000 + RANDOM % 30000))
  if ! (exec 3<> "/dev/tcp/127.0.0.1/$p") 2>/dev/null; then port=$p; break; fi
done
[ "$port" -ne 0 ] || fail "no free port found"
monitor="tcp://127.0.0.1:$port"
echo "== Running a cluster by hand (port 5555 -> $port)"
n=0
while IFS= read -r line; do
  [ -n "$line" ] || continue
  times=1
  [[ $line == *"# twice"* ]] && times=2
  [[ $line == *"# three times"* ]] && times=3
  cmd=${line%%#*}
  cmd=${cmd//5555/$port}
  for _ in $(seq 1 "$times"); do
    n=$((n + 1))
    echo "   $cmd &"
    (cd "$root" && eval "exec $cmd") > "$work/hand$n.out" 2> "$work/hand$n.err" &
    pids+=($!)
    sleep 0.3
  done
done < <(block deploy/README.md "Running a cluster by hand" 1)
[ "$n" -eq 6 ] || fail "expected 6 processes (a monitor, 2 shards, 3 workers), started $n"

# 3. pacerctl, once training runs.
ctl="$build/monitor/pacerctl"
for _ in $(seq 1 120); do
  if "$ctl" --monitor "$monitor" status -o json 2>/dev/null | grep -q '"state": *"running"'; then break; fi
  sleep 0.5
done
"$ctl" --monitor "$monitor" status -o json | grep -q '"state": *"running"' || fail "the job never ran"
unset PACER_MONITOR
# A by-hand worker's id, from its log.
worker=$(sed -n 's/.*worker \([0-9]*\): registered as rank.*/\1/p' "$work"/hand*.err | sort -n | tail -n 1)
[ -n "$worker" ] || fail "no by-hand worker registered"
echo "== pacerctl (a by-hand worker's id: $worker)"
cd "$work"
bg=0
while IFS= read -r line; do
  [ -n "$line" ] || continue
  cmd=${line%%#*}
  cmd=${cmd//5555/$port}
  cmd=$(sed -E "s#(^| )build/#\1$build/#g" <<< "$cmd")
  if [[ $cmd == *remove-worker* ]]; then
    cmd=${cmd//ID/$worker}
  elif [[ $cmd == *" ID"* ]]; then
    idle=$(sed -n 's/.*shard \([0-9]*\): registered with.*/\1/p' "$work"/bg*.err 2>/dev/null | head -n 1)
    [ -n "$idle" ] || fail "'$line' needs an idle shard, and none registered"
    cmd=${cmd//ID/$idle}
  fi
  echo "   $cmd"
  if [[ $cmd =~ \&[[:space:]]*$ ]]; then
    bg=$((bg + 1))
    eval "${cmd%&*}" > "$work/bg$bg.out" 2> "$work/bg$bg.err" &
    pids+=($!)
    # It must register before the next line uses it.
    for _ in $(seq 1 60); do grep -q 'registered with' "$work/bg$bg.err" && break; sleep 0.25; done
    continue
  fi
  rc=0
  eval "$cmd" > "$work/ctl.out" 2> "$work/ctl.err" || rc=$?
  [ "$rc" -eq 0 ] || { cat "$work/ctl.err" >&2; fail "'$line' exited $rc"; }
  if [[ $cmd == *" pause"* ]]; then
    # The comment says "; resume": hold, then let the workers go on.
    "$ctl" resume > /dev/null || fail "pacerctl resume"
  fi
done < <(block monitor/README.md "pacerctl" 1)
cd "$root"
grep -q 'test accuracy' "$work/ctl.out" || fail "--evaluate-model printed no accuracy"

# 4. The README's PyTorch command (README.md, "Train your own model"), with
# the example script as train.py (AdamW, as the README's loop, declared by
# the script alone; evaluation on a side thread) and a shorter time cap.
example=$(block README.md "Train your own model" 1)
[[ $example == "pacer-run "* ]] || fail "no pacer-run command in 'Train your own model': '$example'"
[[ $example == *" train.py"* ]] || fail "the README's pacer-run command runs no train.py: '$example'"
script="$root/worker/python/examples/train_fashion.py --optimizer adamw --train-limit 6000 --test-limit 1000"
cmd="$build/worker/${example//train.py/$script}"
cmd=$(sed -E 's/--time-cap [0-9]+/--time-cap 12/' <<< "$cmd")
echo "== $cmd"
export PYTHONPATH="$build/python"
# Every process it starts inherits the mark: none may be left at the end.
mark="walkthrough-$$-$RANDOM"
marked() {
  local p
  for p in /proc/[0-9]*; do
    [ "$(awk '{ print $3 }' "$p/stat" 2>/dev/null)" != Z ] || continue
    { tr '\0' '\n' < "$p/environ"; } 2>/dev/null | grep -qx "PACER_TEST_MARK=$mark" && echo "${p#/proc/}"
  done
  return 0
}
rc=0
(export PACER_TEST_MARK="$mark"; eval "$cmd") > "$work/run.out" 2> "$work/run.err" || rc=$?
[ "$rc" -eq 0 ] || { tail -30 "$work/run.err" >&2; fail "the README's pacer-run command exited $rc"; }
for _ in $(seq 1 50); do [ -z "$(marked)" ] && break; sleep 0.1; done
[ -z "$(marked)" ] || fail "processes the README's pacer-run command started are left: $(marked)"
[ "$(grep -o '^\[worker [0-9]* rank [0-9]*\]' "$work/run.err" | sort -u | wc -l)" -eq 3 ] ||
  fail "not three workers registered and trained"
acc=$(cat "$work/run.out" "$work/run.err" | sed -n 's/.*final test accuracy: \([0-9.]*\).*/\1/p' | tail -n 1)
awk -v a="${acc:-0}" 'BEGIN { exit !(a > 0.5) }' || fail "final test accuracy '${acc}', not above 0.5"
grep -q '^\[pacer-run\] worker [0-9]* rank [0-9]* *0 ' "$work/run.err" ||
  fail "no row of a worker that exited 0 in pacer-run's table"
# pacer.torch asked for the launch index as its rank too (PACER_RANK).
rows=$(grep -A3 '^\[pacer-run\] worker *exit *mean batch' "$work/run.err" | tail -n 3)
for i in 0 1 2; do
  sed -n "$((i + 1))p" <<< "$rows" | grep -q "^\[pacer-run\] worker [0-9]* rank $i " ||
    fail "the Python worker of launch index $i is not rank $i: $(sed -n "$((i + 1))p" <<< "$rows")"
done
echo "walkthrough: ok"
