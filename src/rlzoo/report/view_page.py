"""The page of ``rlzoo view`` (:mod:`rlzoo.report.view`): HTML, CSS and its own JavaScript in one
string. Charts are SVG drawn by the script; nothing is loaded from the network. With a
``<script id="rlzoo-data">`` element (``--html``) it reads its data from there, else from the
server's ``/api/`` endpoints, which it polls to follow a running run."""

PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>rlzoo view</title>
<style>
body{font:13px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{padding:8px 14px;background:#243447;color:#fff;display:flex;gap:14px;align-items:center;flex-wrap:wrap}
header h1{font-size:16px;margin:0}
.chip{display:inline-flex;align-items:center;gap:5px;margin-right:10px}.sw{width:12px;height:12px;border-radius:2px;display:inline-block}
main{display:grid;grid-template-columns:minmax(380px,1fr) minmax(420px,1.3fr);gap:12px;padding:12px}
section{background:#fff;border:1px solid #ddd;border-radius:6px;padding:10px;min-width:0}
h2{font-size:14px;margin:0 0 8px}
#metric-list{max-height:120px;overflow:auto;border:1px solid #eee;padding:4px;columns:2;font-size:12px}
#metric-list label{display:block;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
#charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(330px,1fr));gap:8px;margin-top:8px}
.chart h4{margin:2px 0;font-size:12px;font-weight:600}
.chart svg{width:100%;height:190px;background:#fff;border:1px solid #eee}
.chart text{font-size:10px;fill:#666}
.controls{display:flex;flex-wrap:wrap;gap:6px;align-items:center;margin-bottom:6px}
.controls input[type=number]{width:64px}
table{border-collapse:collapse;width:100%;font-size:12px}
th,td{border-bottom:1px solid #eee;padding:3px 5px;text-align:left;vertical-align:top}
tbody tr{cursor:pointer}tbody tr:hover{background:#eef4ff}tr.sel{background:#dde8ff}
td.uid{white-space:nowrap}
td.resp{max-width:340px;overflow:hidden;text-overflow:ellipsis;white-space:nowrap;font-family:ui-monospace,monospace}
#table-wrap{max-height:300px;overflow:auto}
#traj{margin-top:10px;border-top:2px solid #ddd;padding-top:8px}
#traj pre,#tokens{font-family:ui-monospace,monospace;white-space:pre-wrap;word-break:break-word;margin:4px 0}
#prompt{color:#666;background:#f4f4f4;padding:6px}
#tokens{padding:6px;border:1px solid #eee;line-height:1.9}
.tok{border-radius:2px;padding:1px 0}
.tok.model{border-bottom:2px solid #4a7bd1}
.tok.env{background:#e9e9e9;color:#555;font-style:italic;border-bottom:2px dashed #999}
.legend{font-size:11px;color:#555;display:flex;gap:10px;flex-wrap:wrap;align-items:center}
.grad{display:inline-block;width:90px;height:10px;vertical-align:middle;border:1px solid #ccc}
#meta{font-size:12px;color:#444}
.muted{color:#888}
</style></head>
<body>
<header><h1>rlzoo view</h1><span id="runs"></span>
<label><input type="checkbox" id="follow" checked> follow</label><span id="status" class="muted"></span></header>
<main>
<section id="curves"><h2>Metrics</h2>
<input id="metric-filter" placeholder="filter metrics (e.g. score, val/, staleness)" style="width:100%">
<div id="metric-list"></div><div id="charts"></div></section>
<section id="samples"><h2>Samples</h2>
<div class="controls">
<select id="run" title="run"></select>
<select id="split" title="split"><option value="train">train</option><option value="val">validation</option></select>
<select id="step" title="step"></select>
<input id="search" placeholder="search prompt / response" size="22">
</div>
<div class="controls">
reward <input id="rmin" type="number" step="any" placeholder="min"> <input id="rmax" type="number" step="any" placeholder="max">
length <input id="lmin" type="number" placeholder="min"> <input id="lmax" type="number" placeholder="max">
truncated <select id="trunc"><option value="">any</option><option value="yes">yes</option><option value="no">no</option></select>
failed <select id="failed"><option value="">any</option><option value="yes">yes</option><option value="no">no</option></select>
<span id="count" class="muted"></span>
</div>
<div id="table-wrap"><table id="sample-table"><thead><tr><th>#</th><th>uid</th><th>reward</th><th>adv</th><th>len</th>
<th>turns</th><th>tools</th><th>finish</th><th>response</th></tr></thead><tbody></tbody></table></div>
<div id="traj" hidden>
<div class="controls"><b id="traj-title"></b>
colour by <select id="colorby"><option value="none">model / environment</option><option value="logprobs">log-prob</option>
<option value="advantages">advantage</option><option value="token_rewards">reward</option><option value="versions">policy version</option></select>
<span class="legend" id="legend"></span></div>
<div id="meta"></div>
<pre id="prompt"></pre>
<div id="tokens"></div>
</div>
</section>
</main>
<!--DATA-->
<script>
"use strict";
const EMBED = document.getElementById("rlzoo-data");
const DATA = EMBED ? JSON.parse(EMBED.textContent) : null;
const COLORS = ["#1f77b4","#d62728","#2ca02c","#9467bd","#ff7f0e","#17becf","#8c564b","#e377c2"];
const DEFAULT_METRICS = ["critic/score/mean","val/mean","response_length/mean","actor/pg_loss","staleness/mean","agent/turns/mean"];
const state = {runs: [], metrics: [], selected: new Set(), samples: [], shown: [], current: null};
const $ = (id) => document.getElementById(id);

async function api(path, params) {
  params = params || {};
  if (DATA) {
    if (path === "runs") return DATA.runs;
    if (path === "metrics") return DATA.metrics[params.run];
    const bySplit = DATA.samples[params.run][params.split] || {};
    if (path === "steps") return Object.keys(bySplit).map(Number).sort((a, b) => a - b);
    if (path === "samples") return bySplit[String(params.step)] || [];
  }
  const r = await fetch("/api/" + path + "?" + new URLSearchParams(params));
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

function el(tag, attrs, text) {
  const e = document.createElementNS(tag === "svg" || ["polyline","line","text","circle","g"].includes(tag) ?
    "http://www.w3.org/2000/svg" : "http://www.w3.org/1999/xhtml", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
const fmt = (v) => v === null || v === undefined ? "" : (Math.abs(v) >= 1000 || (v !== 0 && Math.abs(v) < 0.001) ? v.toExponential(2) : (+v.toFixed(3)).toString());

// ---- metrics ---------------------------------------------------------------------------------
async function loadMetrics() {
  state.metrics = await Promise.all(state.runs.map((r) => api("metrics", {run: r.id})));
  const keys = new Set();
  for (const rows of state.metrics) for (const row of rows) for (const k of Object.keys(row)) if (k !== "step") keys.add(k);
  state.keys = [...keys].sort();
  if (!state.selected.size) for (const k of DEFAULT_METRICS) if (keys.has(k)) state.selected.add(k);
  renderMetricList(); renderCharts();
}
function renderMetricList() {
  const f = $("metric-filter").value.toLowerCase(), list = $("metric-list");
  list.textContent = "";
  for (const k of state.keys.filter((k) => k.toLowerCase().includes(f))) {
    const cb = el("input", {type: "checkbox", "data-key": k});
    cb.checked = state.selected.has(k);
    cb.onchange = () => { cb.checked ? state.selected.add(k) : state.selected.delete(k); renderCharts(); };
    const lab = el("label", {title: k}); lab.append(cb, " " + k); list.append(lab);
  }
}
function renderCharts() {
  const box = $("charts"); box.textContent = "";
  for (const key of state.selected) box.append(chart(key));
}
function chart(key) {
  const W = 340, H = 190, L = 46, R = 8, T = 8, B = 20;
  const series = state.metrics.map((rows) => rows.filter((r) => typeof r[key] === "number" && r.step !== undefined)
    .map((r) => [r.step, r[key]]));
  const all = series.flat();
  const div = el("div", {class: "chart", "data-key": key});
  div.append(el("h4", {}, key));
  const svg = el("svg", {viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none"});
  div.append(svg);
  if (!all.length) { svg.append(el("text", {x: 10, y: 20}, "no data")); return div; }
  let [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
  let [y0, y1] = [Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1]))];
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R), sy = (y) => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  svg.append(el("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#bbb"}));
  svg.append(el("line", {x1: L, y1: T, x2: L, y2: H - B, stroke: "#bbb"}));
  svg.append(el("text", {x: 2, y: T + 8}, fmt(y1)), el("text", {x: 2, y: H - B}, fmt(y0)));
  svg.append(el("text", {x: L, y: H - 6}, "step " + x0), el("text", {x: W - R - 40, y: H - 6}, "step " + x1));
  series.forEach((pts, i) => {
    if (!pts.length) return;
    const pl = el("polyline", {class: "series", "data-run": i, fill: "none", stroke: COLORS[i % COLORS.length],
      "stroke-width": 1.6, points: pts.map((p) => sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1)).join(" ")});
    pl.append(el("title", {}, state.runs[i].name));
    svg.append(pl);
    if (pts.length === 1) svg.append(el("circle", {cx: sx(pts[0][0]), cy: sy(pts[0][1]), r: 2.5, fill: COLORS[i % COLORS.length]}));
  });
  return div;
}

// ---- samples ---------------------------------------------------------------------------------
async function loadSteps(keepStep) {
  const run = +$("run").value, split = $("split").value;
  const steps = await api("steps", {run, split});
  const sel = $("step"), before = sel.value, wasLast = !before || before === sel.options[sel.options.length - 1]?.value;
  if (steps.join() === state.stepsKey) return false;
  state.stepsKey = steps.join();
  sel.textContent = "";
  for (const s of steps) sel.append(el("option", {value: s}, "step " + s));
  sel.value = keepStep && !wasLast && steps.includes(+before) ? before : (steps.length ? steps[steps.length - 1] : "");
  return sel.value !== before;
}
async function loadSamples() {
  const step = $("step").value;
  const run = $("run").value, split = $("split").value;
  state.samples = step === "" ? [] : await api("samples", {run: +run, split, step});
  renderTable();
  document.body.dataset.shown = `${run}:${split}:${step}`;  // what the table holds (tests wait on it)
}
function passes(s) {
  const q = $("search").value.toLowerCase();
  if (q && !((s.prompt || "").toLowerCase().includes(q) || (s.response || "").toLowerCase().includes(q))) return false;
  const num = (id) => $(id).value === "" ? null : +$(id).value;
  const r = s.reward, n = s.response_length;
  if (num("rmin") !== null && !(r >= num("rmin"))) return false;
  if (num("rmax") !== null && !(r <= num("rmax"))) return false;
  if (num("lmin") !== null && !(n >= num("lmin"))) return false;
  if (num("lmax") !== null && !(n <= num("lmax"))) return false;
  if ($("trunc").value && (s.truncated ? "yes" : "no") !== $("trunc").value) return false;
  if ($("failed").value && (s.failed ? "yes" : "no") !== $("failed").value) return false;
  return true;
}
function renderTable() {
  const body = $("sample-table").tBodies[0];
  body.textContent = "";
  state.shown = state.samples.filter(passes);
  $("count").textContent = `${state.shown.length} of ${state.samples.length}`;
  state.shown.forEach((s, i) => {
    const tr = el("tr", {"data-uid": s.uid});
    const cells = [i + 1, s.uid, fmt(s.reward), fmt(s.advantage), s.response_length, s.turns, s.tool_calls,
                   s.finish_reason + (s.failed ? " (failed)" : "")];
    cells.forEach((v, c) => tr.append(el("td", c === 1 ? {class: "uid"} : {}, String(v))));
    tr.append(el("td", {class: "resp", title: s.response}, s.response));
    tr.onclick = () => openTrajectory(s, tr);
    body.append(tr);
  });
}

// ---- trajectory ------------------------------------------------------------------------------
function colour(mode, v, scale) {
  if (v === null || v === undefined) return "";
  if (mode === "logprobs") {  // 0 (sure) white -> -5 and below red
    const t = Math.min(1, Math.max(0, -v / 5)), c = Math.round(255 - 200 * t);
    return `rgb(255, ${c}, ${c})`;
  }
  if (mode === "versions") return `hsl(${(v * 67) % 360}, 70%, 82%)`;
  const t = Math.max(-1, Math.min(1, v / (scale || 1)));  // advantage / reward: red < 0 < green
  const c = Math.round(255 - 170 * Math.abs(t));
  return t >= 0 ? `rgb(${c}, 255, ${c})` : `rgb(255, ${c}, ${c})`;
}
function openTrajectory(s, tr) {
  state.current = s;
  for (const r of $("sample-table").querySelectorAll("tr.sel")) r.classList.remove("sel");
  if (tr) tr.classList.add("sel");
  $("traj").hidden = false;
  $("traj-title").textContent = s.uid + " (step " + s.step + ")";
  $("meta").textContent = `reward ${fmt(s.reward)} · score ${fmt(s.score)} · advantage ${fmt(s.advantage)} · ` +
    `${s.response_length} tokens (${s.model_tokens} by the model) · turns ${s.turns} · tool calls ${s.tool_calls} · ` +
    `finish ${s.finish_reason}${s.truncated ? " · truncated" : ""}${s.failed ? " · scoring failed" : ""}`;
  $("prompt").textContent = s.prompt;
  renderTokens();
}
function renderTokens() {
  const s = state.current, box = $("tokens"), mode = $("colorby").value;
  if (!s) return;
  box.textContent = "";
  const toks = s.tokens, mask = s.model_mask || [];
  if (!toks) { box.textContent = s.response; $("legend").textContent = "(no tokens kept: run.samples.keep_tokens=false)"; return; }
  const vals = mode === "none" ? null : s[mode];
  let scale = 1;
  if (vals && (mode === "advantages" || mode === "token_rewards"))
    scale = Math.max(1e-9, ...vals.filter((v, j) => mask[j]).map(Math.abs));
  toks.forEach((t, j) => {
    const model = mask[j] !== 0;
    const span = el("span", {class: "tok " + (model ? "model" : "env"), "data-i": j}, t);
    const v = vals ? vals[j] : null;
    let tip = (model ? "model" : "environment / tool") + ` token ${j}`;
    for (const [k, name] of [["logprobs", "log-prob"], ["advantages", "advantage"], ["token_rewards", "reward"], ["versions", "version"]])
      if (s[k] && s[k][j] !== undefined && s[k][j] !== null) tip += ` · ${name} ${fmt(s[k][j])}`;
    span.title = tip;
    if (model && v !== null && v !== undefined) { span.dataset.v = v; span.style.background = colour(mode, v, scale); }
    box.append(span);
  });
  const legend = $("legend");
  legend.textContent = "";
  if (mode === "none") legend.innerHTML = '<span class="tok model">model</span> <span class="tok env">environment / tool</span>';
  else if (!vals) legend.textContent = "(not kept for this sample)";
  else if (mode === "logprobs") legend.innerHTML = '0 <span class="grad" style="background:linear-gradient(90deg,#fff,rgb(255,55,55))"></span> &le; -5';
  else if (mode === "versions") legend.textContent = "one hue per policy version";
  else legend.innerHTML = `-${fmt(scale)} <span class="grad" style="background:linear-gradient(90deg,rgb(255,85,85),#fff,rgb(85,255,85))"></span> +${fmt(scale)}`;
}

// ---- wiring ----------------------------------------------------------------------------------
async function refresh() {
  try {
    await loadMetrics();
    if (await loadSteps(true)) await loadSamples();
    $("status").textContent = DATA ? "(saved page)" : "updated " + new Date().toLocaleTimeString();
  } catch (e) { $("status").textContent = "error: " + e.message; }
}
async function init() {
  state.runs = await api("runs");
  const chips = $("runs"), runSel = $("run");
  state.runs.forEach((r, i) => {
    const c = el("span", {class: "chip", title: r.path});
    c.append(el("span", {class: "sw", style: "background:" + COLORS[i % COLORS.length]}), r.name);
    chips.append(c);
    runSel.append(el("option", {value: r.id}, r.name));
  });
  $("metric-filter").oninput = renderMetricList;
  for (const id of ["search", "rmin", "rmax", "lmin", "lmax", "trunc", "failed"]) $(id).oninput = renderTable;
  for (const id of ["trunc", "failed"]) $(id).onchange = renderTable;
  $("run").onchange = $("split").onchange = async () => { state.stepsKey = null; $("step").value = ""; await loadSteps(false); await loadSamples(); };
  $("step").onchange = loadSamples;
  $("colorby").onchange = renderTokens;
  await loadMetrics();
  await loadSteps(false);
  await loadSamples();
  document.body.dataset.ready = "1";
  if (DATA) { $("follow").checked = false; $("follow").disabled = true; $("status").textContent = "(saved page)"; return; }
  setInterval(() => { if ($("follow").checked) refresh(); }, 2000);
}
init().catch((e) => { $("status").textContent = "error: " + e.message; document.body.dataset.ready = "error"; });
</script>
</body></html>
"""
