#!/usr/bin/env bash
# Pacer quick start: set up, then train Fashion-MNIST on a local cluster on
# 127.0.0.1 (1 monitor, 2 shards, 3 workers) until test accuracy 0.85 or a
# time cap. Ctrl-C stops everything this script started. Every option but
# --skip-setup goes to deploy/local-cluster.sh (see its --help: policies,
# modes, straggler emulation).
#
#   deploy/quickstart.sh [--skip-setup] [--shards N] [--workers N] [--time-cap S]
#                        [--target A] [--policy P] [--mode M] [...]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
args=()
skip_setup=0
for a in "$@"; do
  case "$a" in
    --skip-setup) skip_setup=1 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$a") ;;
  esac
done
[ "$skip_setup" -eq 1 ] || "$root/deploy/setup.sh"
exec "$root/deploy/local-cluster.sh" "${args[@]}"
