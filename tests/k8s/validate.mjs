// Validates rendered Kubernetes manifests offline: every document against
// its kind's schema (kubernetes-models; the Prometheus Operator's CRDs from
// @kubernetes-models/prometheus-operator), plus the conventions Pacer's
// manifests promise (deploy/k8s/README.md).
//   node validate.mjs FILE.yaml [--rules deploy/prometheus/pacer.rules.yml]
//                    [--docs deploy/k8s/README.md [--namespace NS]]
// --docs: every Secret and ConfigMap the pods use that the manifests do not
// define must be created by a `kubectl -n NS create secret|configmap ...
// NAME` line of that file, in the namespace the objects land in (their
// metadata.namespace, else --namespace, else "default").
// Exit 0 when valid; otherwise each problem on stderr and exit 1.
import { readFileSync } from "node:fs";
import { isDeepStrictEqual } from "node:util";
import { parseAllDocuments, parse } from "yaml";
import { ConfigMap, Namespace, Service } from "kubernetes-models/v1";
import { Deployment, StatefulSet } from "kubernetes-models/apps/v1";
import { PodDisruptionBudget } from "kubernetes-models/policy/v1";
import { PrometheusRule, ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";

const kinds = {
  "v1/ConfigMap": ConfigMap, "v1/Namespace": Namespace, "v1/Service": Service,
  "apps/v1/Deployment": Deployment, "apps/v1/StatefulSet": StatefulSet,
  "policy/v1/PodDisruptionBudget": PodDisruptionBudget,
  "monitoring.coreos.com/v1/PrometheusRule": PrometheusRule,
  "monitoring.coreos.com/v1/ServiceMonitor": ServiceMonitor,
};

const args = process.argv.slice(2);
const file = args[0];
const rulesAt = args.indexOf("--rules");
const problems = [];
const problem = (what, msg) => problems.push(`${what}: ${msg}`);

const docs = parseAllDocuments(readFileSync(file, "utf8"));
const objects = [];
for (const d of docs) {
  if (d.errors.length) { problem(file, d.errors.map(String).join("; ")); continue; }
  const o = d.toJS();
  if (o) objects.push(o);
}
if (objects.length === 0) problem(file, "no objects");

for (const o of objects) {
  const what = `${o.kind}/${o.metadata?.name}`;
  const Model = kinds[`${o.apiVersion}/${o.kind}`];
  if (!Model) { problem(what, `unexpected kind ${o.apiVersion} ${o.kind}`); continue; }
  try {
    new Model(o).validate();
  } catch (e) {
    problem(what, `schema: ${e.message}`);
  }
  const labels = o.metadata?.labels ?? {};
  if (o.kind !== "Namespace" && labels["app.kubernetes.io/name"] !== "pacer") {
    problem(what, "lacks the label app.kubernetes.io/name: pacer");
  }
}

const byKind = (k) => objects.filter((o) => o.kind === k);
const services = new Map(byKind("Service").map((s) => [s.metadata.name, s]));
const probePath = (c, probe) => c[probe]?.httpGet?.path;

for (const ss of byKind("StatefulSet")) {
  const what = `StatefulSet/${ss.metadata.name}`;
  const svc = services.get(ss.spec.serviceName);
  if (!svc) problem(what, `its serviceName ${ss.spec.serviceName} names no Service`);
  else {
    if (svc.spec.clusterIP !== "None") problem(what, "its Service is not headless");
    if (svc.spec.publishNotReadyAddresses !== true) problem(what, "its Service does not publish not-ready addresses");
  }
  if (!ss.spec.volumeClaimTemplates?.length) problem(what, "has no volumeClaimTemplate");
  const c = ss.spec.template.spec.containers[0];
  if (!c.args?.includes("--data-dir")) problem(what, "does not pass --data-dir");
  const mounts = (c.volumeMounts ?? []).map((m) => m.name);
  if (!mounts.includes(ss.spec.volumeClaimTemplates?.[0]?.metadata?.name)) problem(what, "does not mount its claim");
}
for (const o of [...byKind("StatefulSet"), ...byKind("Deployment")]) {
  const what = `${o.kind}/${o.metadata.name}`;
  const c = o.spec.template.spec.containers[0];
  if (probePath(c, "livenessProbe") !== "/livez") problem(what, "liveness probe is not /livez");
  if (probePath(c, "readinessProbe") !== "/readyz") problem(what, "readiness probe is not /readyz");
  const ann = o.spec.template.metadata.annotations ?? {};
  if (ann["prometheus.io/scrape"] !== "true") problem(what, "pod not annotated for scraping");
  if (!(c.args ?? []).includes("--config")) problem(what, "does not read its --config");
  // Transport security on: a key from a mounted Secret, and the allowed
  // keys named in its settings.
  const args = c.args ?? [];
  const key = args[args.indexOf("--key") + 1];
  if (!args.includes("--key") || !key) { problem(what, "runs without --key (transport security)"); continue; }
  const mount = (c.volumeMounts ?? []).find((m) => key.startsWith(m.mountPath + "/"));
  const volume = (o.spec.template.spec.volumes ?? []).find((v) => v.name === mount?.name);
  if (!volume?.secret?.secretName) problem(what, `its --key ${key} is not in a mounted Secret`);
  else if ((volume.secret.defaultMode ?? 0o644) & 0o037) problem(what, "its key Secret is readable by others");
  else if (!volume.secret.items || volume.secret.items.some((i) => i.key.endsWith(".key") && !key.endsWith("/" + i.path))) {
    problem(what, "its key Secret gives it other roles' secret keys (project only its own with items)");
  }
  if (!o.spec.template.spec.securityContext?.fsGroup) problem(what, "no fsGroup to read its key Secret");
  const role = o.spec.template.metadata.labels["app.kubernetes.io/component"];
  const cm = byKind("ConfigMap").find((m) => m.data?.[`${role}.toml`]);
  if (!/^allowed-keys\s*=\s*"\/etc\/pacer-keys\/allowed"/m.test(cm?.data?.[`${role}.toml`] ?? "")) {
    problem(what, `${role}.toml names no allowed-keys in the key Secret`);
  }
}
const server = byKind("StatefulSet").find((s) => s.spec.template.metadata.labels["app.kubernetes.io/component"] === "server");
const monitor = byKind("StatefulSet").find((s) => s.spec.template.metadata.labels["app.kubernetes.io/component"] === "monitor");
const worker = byKind("Deployment").find((s) => s.spec.template.metadata.labels["app.kubernetes.io/component"] === "worker");
if (!server) problem("manifests", "no shard StatefulSet");
if (!monitor) problem("manifests", "no monitor StatefulSet");
if (!worker) problem("manifests", "no worker Deployment");
if (monitor && monitor.spec.replicas !== 1) problem("monitor", "must have exactly one replica");
if (server) {
  const c = server.spec.template.spec.containers[0];
  if (!c.startupProbe) problem("server", "no startupProbe (checkpoint loading)");
  if (!c.args.includes("--advertise")) problem("server", "no --advertise");
  const aa = server.spec.template.spec.affinity?.podAntiAffinity;
  if (!aa) problem("server", "no pod anti-affinity");
  const pdb = byKind("PodDisruptionBudget").find((p) =>
    isDeepStrictEqual(p.spec.selector.matchLabels, server.spec.selector.matchLabels));
  if (!pdb) problem("server", "no PodDisruptionBudget selecting the shards");
  else if (pdb.spec.maxUnavailable !== 1) problem("server", "PDB maxUnavailable is not 1");
  // The monitor waits for as many shards as the StatefulSet runs.
  const cm = byKind("ConfigMap").find((m) => m.data?.["monitor.toml"]);
  const minShards = Number((cm?.data["monitor.toml"].match(/^min-shards\s*=\s*(\d+)/m) ?? [])[1]);
  if (minShards !== server.spec.replicas) {
    problem("config", `monitor min-shards ${minShards} but ${server.spec.replicas} shard replicas`);
  }
}
if (byKind("ServiceMonitor").length !== 1) problem("monitoring", "expected one ServiceMonitor");
const rule = byKind("PrometheusRule")[0];
if (!rule) problem("monitoring", "no PrometheusRule");
if (rule && rulesAt >= 0) {
  const shipped = parse(readFileSync(args[rulesAt + 1], "utf8"));
  if (!isDeepStrictEqual(rule.spec.groups, shipped.groups)) {
    problem("PrometheusRule", `its groups differ from ${args[rulesAt + 1]}`);
  }
}
if (!byKind("ConfigMap").some((m) => m.metadata.labels?.grafana_dashboard === "1" &&
    Object.keys(m.data ?? {}).some((k) => k.endsWith(".json")))) {
  problem("grafana", "no dashboard ConfigMap labelled grafana_dashboard=1");
}

const docsAt = args.indexOf("--docs");
if (docsAt >= 0) {
  const nsAt = args.indexOf("--namespace");
  const fallback = nsAt >= 0 ? args[nsAt + 1] : "default";
  const created = new Set();
  const text = readFileSync(args[docsAt + 1], "utf8");
  for (const m of text.matchAll(/kubectl\s+-n\s+(\S+)\s+create\s+(secret|configmap)\s+(?:generic\s+)?(\S+)/g)) {
    created.add(`${m[2]}/${m[1]}/${m[3]}`);
  }
  const defined = new Set(objects.map((o) => `${o.kind.toLowerCase()}/${o.metadata?.namespace ?? fallback}/${o.metadata?.name}`));
  for (const o of [...byKind("StatefulSet"), ...byKind("Deployment")]) {
    const ns = o.metadata.namespace ?? fallback;
    const pod = o.spec.template.spec;
    const uses = [];
    for (const v of pod.volumes ?? []) {
      if (v.secret?.secretName) uses.push(["secret", v.secret.secretName]);
      if (v.configMap?.name) uses.push(["configmap", v.configMap.name]);
    }
    for (const c of [...(pod.containers ?? []), ...(pod.initContainers ?? [])]) {
      for (const e of c.envFrom ?? []) {
        if (e.secretRef?.name) uses.push(["secret", e.secretRef.name]);
        if (e.configMapRef?.name) uses.push(["configmap", e.configMapRef.name]);
      }
      for (const e of c.env ?? []) {
        if (e.valueFrom?.secretKeyRef?.name) uses.push(["secret", e.valueFrom.secretKeyRef.name]);
        if (e.valueFrom?.configMapKeyRef?.name) uses.push(["configmap", e.valueFrom.configMapKeyRef.name]);
      }
    }
    for (const [kind, name] of uses) {
      const key = `${kind}/${ns}/${name}`;
      if (!defined.has(key) && !created.has(key)) {
        problem(`${o.kind}/${o.metadata.name}`, `uses ${kind} ${name} in namespace ${ns}, which neither ` +
                `the manifests nor ${args[docsAt + 1]} create there ("kubectl -n ${ns} create ${kind} ... ${name}")`);
      }
    }
  }
}

if (problems.length) {
  for (const p of problems) console.error(`INVALID ${p}`);
  process.exit(1);
}
console.log(`${file}: ${objects.length} objects valid`);
