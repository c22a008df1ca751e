// Renders deploy/helm/pacer offline, for the tests: there is no `helm`
// binary on this platform (not in Debian 12, not on npm). This is NOT Helm:
// it implements only the part of Go templates and Helm's functions the chart
// uses, and fails loudly on anything else, so the chart cannot drift outside
// what is checked here:
//   {{ .Values.a.b }} {{ .Release.Name }} {{ .Chart.AppVersion }} {{ . }}
//   {{- ... -}} whitespace trimming, {{/* comments */}},
//   {{ define "n" }} ... {{ end }},
//   {{ if X }} ... {{ else }} ... {{ end }}, pipelines with
//   include, quote, toYaml, indent, nindent, eq, not, and .Files.Get.
//
//   node render-chart.mjs CHART_DIR [--set path=value ...] > out.yaml
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { parse, stringify } from "yaml";

const [chartDir, ...rest] = process.argv.slice(2);
const values = parse(readFileSync(join(chartDir, "values.yaml"), "utf8"));
for (let i = 0; i < rest.length; i++) {
  if (rest[i] !== "--set") throw new Error(`unknown argument ${rest[i]}`);
  const [path, raw] = rest[++i].split("=");
  const keys = path.split(".");
  let o = values;
  for (const k of keys.slice(0, -1)) o = o[k];
  o[keys.at(-1)] = /^-?\d+(\.\d+)?$/.test(raw) ? Number(raw) : raw === "true" ? true : raw === "false" ? false : raw;
}
const chart = parse(readFileSync(join(chartDir, "Chart.yaml"), "utf8"));
const root = {
  Values: values,
  Release: { Name: "pacer", Namespace: "default", Service: "Helm" },
  Chart: { Name: chart.name, Version: chart.version, AppVersion: chart.appVersion },
};

// --- parsing ----------------------------------------------------------------
function tokenize(src) {
  const out = [];
  const re = /\{\{(-\s)?([\s\S]*?)(\s-)?\}\}/g;
  let last = 0;
  for (let m; (m = re.exec(src));) {
    out.push({ type: "text", v: src.slice(last, m.index) });
    out.push({ type: "action", v: m[2].trim(), ltrim: !!m[1], rtrim: !!m[3] });
    last = re.lastIndex;
  }
  out.push({ type: "text", v: src.slice(last) });
  for (let i = 0; i < out.length; i++) {
    if (out[i].type !== "action") continue;
    if (out[i].ltrim && out[i - 1]) out[i - 1].v = out[i - 1].v.replace(/\s+$/, "");
    if (out[i].rtrim && out[i + 1]) out[i + 1].v = out[i + 1].v.replace(/^\s+/, "");
  }
  return out.filter((t) => t.type === "action" || t.v !== "");
}

const defines = {};
function parseNodes(tokens, pos, file) {
  const nodes = [];
  while (pos.i < tokens.length) {
    const t = tokens[pos.i++];
    if (t.type === "text") { nodes.push(t); continue; }
    if (t.v.startsWith("/*") && t.v.endsWith("*/")) continue;  // a comment
    const word = t.v.split(/\s+/)[0];
    if (word === "end" || word === "else") return { nodes, stop: word };
    if (word === "define") {
      const name = JSON.parse(t.v.slice(6).trim());
      const body = parseNodes(tokens, pos, file);
      if (body.stop !== "end") throw new Error(`${file}: define ${name} without end`);
      defines[name] = body.nodes;
    } else if (word === "if") {
      const then = parseNodes(tokens, pos, file);
      let otherwise = { nodes: [] };
      if (then.stop === "else") otherwise = parseNodes(tokens, pos, file);
      if ((otherwise.stop ?? then.stop) !== "end") throw new Error(`${file}: if without end`);
      nodes.push({ type: "if", cond: t.v.slice(2).trim(), then: then.nodes, otherwise: otherwise.nodes });
    } else if (["range", "with", "template", "block", "else if"].includes(word)) {
      throw new Error(`${file}: '${word}' is outside the template subset this renderer supports`);
    } else {
      nodes.push({ type: "expr", v: t.v });
    }
  }
  return { nodes };
}

// --- evaluation -------------------------------------------------------------
function splitOutside(s, sep) {
  const parts = [];
  let cur = "", quote = false;
  for (const c of s) {
    if (c === '"') quote = !quote;
    if (c === sep && !quote) { parts.push(cur.trim()); cur = ""; } else cur += c;
  }
  parts.push(cur.trim());
  return parts;
}
function args(s) {
  return s.match(/"(?:[^"\\]|\\.)*"|\S+/g) ?? [];
}
function operand(tok, ctx) {
  if (tok.startsWith('"')) return JSON.parse(tok);
  if (/^-?\d+(\.\d+)?$/.test(tok)) return Number(tok);
  if (tok === ".") return ctx;
  if (tok.startsWith(".")) {
    let v = ctx;
    for (const k of tok.slice(1).split(".")) {
      if (v === undefined || v === null) throw new Error(`no value at ${tok}`);
      v = v[k];
    }
    return v;
  }
  throw new Error(`unsupported operand ${tok}`);
}
const truthy = (v) => !(v === undefined || v === null || v === false || v === 0 || v === "" ||
  (Array.isArray(v) && v.length === 0) || (typeof v === "object" && Object.keys(v).length === 0));
const str = (v) => (typeof v === "string" ? v : v === undefined || v === null ? "" : String(v));
const indent = (n, s) => str(s).split("\n").map((l) => " ".repeat(n) + l).join("\n");
const functions = {
  include: (name, ctx) => {
    if (!defines[name]) throw new Error(`include of undefined template ${name}`);
    return renderNodes(defines[name], ctx);
  },
  quote: (v) => JSON.stringify(str(v)),
  toYaml: (v) => stringify(v, { sortMapEntries: true }).replace(/\n$/, ""),
  indent: (n, s) => indent(n, s),
  nindent: (n, s) => "\n" + indent(n, s),
  eq: (a, b) => a === b,
  not: (v) => !truthy(v),
  ".Files.Get": (path) => readFileSync(join(chartDir, path), "utf8"),
};
function evalPipeline(expr, ctx) {
  let value, first = true;
  for (const cmd of splitOutside(expr, "|")) {
    const [head, ...tail] = args(cmd);
    const fn = functions[head];
    if (fn) {
      const a = tail.map((t) => operand(t, ctx));
      if (!first) a.push(value);
      value = fn(...a);
    } else if (first && tail.length === 0) {
      value = operand(head, ctx);
    } else {
      throw new Error(`unsupported command '${cmd}'`);
    }
    first = false;
  }
  return value;
}
function renderNodes(nodes, ctx) {
  let out = "";
  for (const n of nodes) {
    if (n.type === "text") out += n.v;
    else if (n.type === "expr") out += str(evalPipeline(n.v, ctx));
    else out += renderNodes(truthy(evalPipeline(n.cond, ctx)) ? n.then : n.otherwise, ctx);
  }
  return out;
}

// --- the chart ----------------------------------------------------------------
const dir = join(chartDir, "templates");
const files = readdirSync(dir).sort();
const parsed = {};
for (const f of files) {
  parsed[f] = parseNodes(tokenize(readFileSync(join(dir, f), "utf8")), { i: 0 }, f);
  if (parsed[f].stop) throw new Error(`${f}: stray {{ ${parsed[f].stop} }}`);
}
const docs = [];
for (const f of files) {
  if (f.startsWith("_") || !f.endsWith(".yaml")) continue;
  const text = renderNodes(parsed[f].nodes, root).trim();
  if (text) docs.push(`# Source: pacer/templates/${f}\n${text}`);
}
renderNodes(parsed["NOTES.txt"]?.nodes ?? [], root);  // must render too
process.stdout.write(docs.join("\n---\n") + "\n");
