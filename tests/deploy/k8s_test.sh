#!/usr/bin/env bash
# The Kubernetes deployment, offline (there is no API server here):
#  - the kustomize base and overlays render (`kubectl kustomize`);
#  - the Helm chart renders (tests/k8s/render-chart.mjs: no `helm` binary on
#    this platform; it covers only the template subset the chart uses);
#  - every rendered object validates against its schema (npm
#    kubernetes-models, pinned in tests/k8s/package-lock.json) and the
#    conventions of deploy/k8s/README.md (tests/k8s/validate.mjs);
#  - the copies of the dashboard and the rules match deploy/grafana and
#    deploy/prometheus.
# Exit 77 (skipped) without node; the kustomize part needs kubectl.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
fail() { echo "FAIL: $*" >&2; exit 1; }

cmp deploy/grafana/pacer-dashboard.json deploy/k8s/base/pacer-dashboard.json ||
  fail "deploy/k8s/base/pacer-dashboard.json differs from deploy/grafana/pacer-dashboard.json"
cmp deploy/grafana/pacer-dashboard.json deploy/helm/pacer/files/pacer-dashboard.json ||
  fail "the Helm chart's dashboard differs from deploy/grafana/pacer-dashboard.json"
cmp deploy/prometheus/pacer.rules.yml deploy/helm/pacer/files/pacer.rules.yml ||
  fail "the Helm chart's rules differ from deploy/prometheus/pacer.rules.yml"

if ! command -v node >/dev/null 2>&1; then
  echo "SKIP: node not found (Node.js validates the manifests)"
  exit 77
fi
if [ ! -d tests/k8s/node_modules/kubernetes-models ]; then
  echo "installing the pinned validator (npm ci in tests/k8s)"
  (cd tests/k8s && npm ci --no-audit --no-fund >/dev/null) || fail "npm ci in tests/k8s"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# validate FILE [FLAGS]: FLAGS --docs/--namespace check that the Secrets the
# pods use are created where deploy/k8s/README.md says.
validate() { node tests/k8s/validate.mjs "$@" --rules deploy/prometheus/pacer.rules.yml; }
docs=(--docs deploy/k8s/README.md)

if command -v kubectl >/dev/null 2>&1; then
  for k in base overlays/dev overlays/production; do
    kubectl kustomize "deploy/k8s/$k" > "$tmp/k.yaml" || fail "kubectl kustomize deploy/k8s/$k"
    echo -n "deploy/k8s/$k: "
    if [ "$k" = base ]; then validate "$tmp/k.yaml"; else validate "$tmp/k.yaml" "${docs[@]}"; fi
  done
else
  echo "kubectl not found: the kustomize base and overlays were not rendered"
fi

node tests/k8s/render-chart.mjs deploy/helm/pacer > "$tmp/chart.yaml" || fail "rendering the chart"
echo -n "helm chart (defaults): "
# The README installs the chart with --namespace pacer.
validate "$tmp/chart.yaml" "${docs[@]}" --namespace pacer
node tests/k8s/render-chart.mjs deploy/helm/pacer --set server.replicas=4 --set worker.replicas=8 \
  --set server.antiAffinity=required > "$tmp/chart2.yaml" || fail "rendering the chart"
grep -q requiredDuringSchedulingIgnoredDuringExecution "$tmp/chart2.yaml" ||
  fail "server.antiAffinity=required did not take"
echo -n "helm chart (4 shards, required anti-affinity): "
validate "$tmp/chart2.yaml"
node tests/k8s/render-chart.mjs deploy/helm/pacer --set metrics.serviceMonitor=false \
  --set metrics.prometheusRule=false > "$tmp/chart3.yaml" || fail "rendering the chart"
! grep -q "kind: ServiceMonitor" "$tmp/chart3.yaml" || fail "metrics.serviceMonitor=false did not take"
node tests/k8s/render-chart.mjs deploy/helm/pacer --set job.replicas=1 --set job.shardLease=0.5 \
  > "$tmp/chart4.yaml" || fail "rendering the chart"
grep -q "^ *replicas = 1$" "$tmp/chart4.yaml" && grep -q "^ *shard-lease = 0.5$" "$tmp/chart4.yaml" ||
  fail "job.replicas=1 and job.shardLease=0.5 did not reach monitor.toml"
echo -n "helm chart (--replicas 1): "
validate "$tmp/chart4.yaml"
echo "kubernetes: ok"
