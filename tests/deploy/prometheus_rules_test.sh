#!/usr/bin/env bash
# The shipped Prometheus files: both configs and the rules pass promtool's
# checks, and every alert and recording rule passes its unit tests
# (tests/prometheus/rules_test.yml). Exit 77 (skipped) without promtool.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if ! command -v promtool >/dev/null 2>&1; then
  echo "SKIP: promtool not found (Debian package 'prometheus', installed by deploy/setup.sh)"
  exit 77
fi
cd "$root"
promtool check rules deploy/prometheus/pacer.rules.yml
promtool test rules tests/prometheus/rules_test.yml
# The local config, with a targets file in the format local-cluster.sh writes.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp deploy/prometheus/prometheus.yml deploy/prometheus/pacer.rules.yml "$tmp/"
mkdir "$tmp/targets"
echo '[{"targets": ["127.0.0.1:9100"], "labels": {"job": "pacer-monitor"}}]' > "$tmp/targets/local.json"
promtool check config "$tmp/prometheus.yml"
# The Kubernetes variant: Debian builds Prometheus without Kubernetes service
# discovery, so its promtool cannot check kubernetes_sd_configs; check the
# rest of the file by swapping that block for a static one.
sed -e 's/kubernetes_sd_configs:/static_configs:/' -e 's/- role: pod/- targets: ["127.0.0.1:1"]/' \
  deploy/prometheus/prometheus-kubernetes.yml > "$tmp/prometheus-kubernetes.yml"
promtool check config "$tmp/prometheus-kubernetes.yml"
echo "prometheus files: ok"
