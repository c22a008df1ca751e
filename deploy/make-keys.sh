#!/usr/bin/env bash
# Writes the CURVE keys of one Pacer cluster (transport security) into DIR:
#   monitor.key, server-I.key (I < N), worker-I.key (I < M): one keypair per
#   process, mode 0600 (`pacerctl keygen`);
#   allowed: every public key, one "NAME KEY" line each, the monitor's named
#   "monitor": give it to every process as --allowed-keys;
#   operator/operator.key: the key pacerctl needs for the commands that change
#   a job (remove-worker, add-shard, drain-shard, pause, resume, fault set and
#   clear; any allowed key reads the status). It is in a folder of its own,
#   so that a Kubernetes Secret made from DIR leaves it out: keep it with the
#   people who run pacerctl.
# With --roles: one keypair per role instead (monitor.key, server.key,
# worker.key), for Kubernetes, where the pods of a StatefulSet or Deployment
# share one template and so one Secret; then
#   kubectl -n NAMESPACE create secret generic pacer-keys --from-file=DIR
# (which takes DIR's files, not operator/).
# The systemd units read /etc/pacer/keys (make it with this script, as root,
# then copy allowed and each host's keys there); see deploy/README.md, "Transport
# security". Existing keys are never overwritten: a second run keeps them,
# makes the missing ones and rewrites `allowed`.
#
#   deploy/make-keys.sh DIR [--shards N] [--workers M] [--roles] [--pacerctl PATH]
set -euo pipefail
dir="" shards=2 workers=2 pacerctl="" roles=0
while [ $# -gt 0 ]; do
  case "$1" in
    --shards) shards=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --pacerctl) pacerctl=$2; shift 2 ;;
    --roles) roles=1; shift ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "make-keys.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) [ -z "$dir" ] || { echo "make-keys.sh: one DIR only" >&2; exit 2; }; dir=$1; shift ;;
  esac
done
[ -n "$dir" ] || { echo "usage: make-keys.sh DIR [--shards N] [--workers M]" >&2; exit 2; }
if [ -z "$pacerctl" ]; then
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  for p in "$root/build/monitor/pacerctl" "$(command -v pacerctl || true)"; do
    if [ -n "$p" ] && [ -x "$p" ]; then pacerctl=$p; break; fi
  done
fi
[ -x "$pacerctl" ] || { echo "make-keys.sh: no pacerctl (build first, or --pacerctl PATH)" >&2; exit 1; }
mkdir -p "$dir/operator"
chmod 755 "$dir"
chmod 700 "$dir/operator"
names=(monitor)
if [ "$roles" -eq 1 ]; then
  names+=(server worker)
else
  for ((i = 0; i < shards; ++i)); do names+=("server-$i"); done
  for ((i = 0; i < workers; ++i)); do names+=("worker-$i"); done
fi
: > "$dir/allowed.new"
names+=(operator/operator)
made=0 kept=0
for n in "${names[@]}"; do
  # A keypair that exists is kept (run again to add keys, such as the
  # operator's to a folder made before it existed); `allowed` is rewritten.
  if [ -f "$dir/$n.key" ] && [ -f "$dir/$n.pub" ]; then
    kept=$((kept + 1))
  else
    "$pacerctl" keygen "$dir/$n" --name "${n##*/}" >/dev/null 2>"$dir/.keygen.err" ||
      { cat "$dir/.keygen.err" >&2; rm -f "$dir/.keygen.err" "$dir/allowed.new"; exit 1; }
    made=$((made + 1))
  fi
  grep -v '^#' "$dir/$n.pub" >> "$dir/allowed.new"
done
rm -f "$dir/.keygen.err"
mv "$dir/allowed.new" "$dir/allowed"
chmod 644 "$dir/allowed"
echo "wrote $made keypair(s), kept $kept, and $dir/allowed"
