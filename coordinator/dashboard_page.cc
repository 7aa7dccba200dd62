// The dashboard page served at /: one self-contained document (no external resources, so it works
// on an air-gapped cluster) that polls /api/state every second and redraws. The DOM carries data-*
// attributes (worker and run ids, loss point counts) so tests and scripts can read what is shown.
#include "coordinator/dashboard.h"

namespace strata::coordinator {

std::string_view DashboardPageHtml() {
  static constexpr std::string_view kPage = R"HTML(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Strata dashboard</title>
<style>
  :root { --bg:#0f1419; --panel:#182028; --line:#2a3540; --text:#d8e0e8; --dim:#8a98a8;
          --ok:#3fb950; --busy:#d29922; --bad:#f85149; --accent:#58a6ff; }
  * { box-sizing: border-box; }
  body { margin:0; font:14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; background:var(--bg); color:var(--text); }
  header { display:flex; align-items:baseline; gap:16px; padding:12px 20px; border-bottom:1px solid var(--line); }
  header h1 { font-size:18px; margin:0; }
  header .dim { color:var(--dim); font-size:12px; }
  #conn.bad, .line.bad { color:var(--bad); }
  main { padding:16px 20px; display:grid; gap:16px; }
  section { background:var(--panel); border:1px solid var(--line); border-radius:6px; padding:12px 16px; }
  h2 { font-size:14px; margin:0 0 10px; color:var(--dim); text-transform:uppercase; letter-spacing:.05em; }
  table { width:100%; border-collapse:collapse; }
  th, td { text-align:left; padding:4px 8px; border-bottom:1px solid var(--line); vertical-align:middle; }
  th { color:var(--dim); font-weight:normal; font-size:12px; }
  .badge { white-space:nowrap; display:inline-block; padding:1px 8px; border-radius:10px; font-size:12px; background:var(--line); }
  .s-idle, .s-finished { background:#1f3a27; color:var(--ok); }
  .s-busy, .s-running { background:#3a311a; color:var(--busy); }
  .s-lost, .s-failed { background:#3d1d1d; color:var(--bad); }
  .s-cancelled, .s-pending { background:#262f3a; color:var(--dim); }
  .bar { position:relative; height:14px; background:#0b0f13; border-radius:3px; overflow:hidden; min-width:160px; }
  .bar > div { position:absolute; top:0; bottom:0; left:0; }
  .bar .used { background:#2f5d8a; } .bar .alloc { background:var(--accent); }
  .bar .prog { background:var(--ok); }
  .bar span { position:absolute; left:6px; top:0; font-size:11px; line-height:14px; white-space:nowrap; }
  .top { display:grid; grid-template-columns:minmax(340px, 440px) 1fr; gap:16px; align-items:start; }
  .runlist { display:flex; flex-direction:column; gap:6px; max-height:70vh; overflow:auto; }
  .run { border:1px solid var(--line); border-radius:5px; padding:6px 10px; cursor:pointer; }
  .run.selected { border-color:var(--accent); background:#1d2833; }
  .run.hurt { border-left:3px solid var(--busy); }
  .run .title { display:flex; justify-content:space-between; align-items:center; gap:8px; }
  .run .title b { overflow:hidden; text-overflow:ellipsis; white-space:nowrap; }
  .run .bar { margin-top:4px; }
  .line { display:flex; flex-wrap:wrap; gap:4px 12px; color:var(--dim); font-size:12px; margin-top:3px; }
  .line b { color:var(--text); font-weight:600; }
  .fail { display:inline-block; padding:0 6px; border-radius:8px; font-size:11px; background:#3a311a; color:var(--busy); }
  .fail.oom, .fail.worker-lost { background:#3d1d1d; color:var(--bad); }
  #detail canvas.loss { width:100%; height:180px; display:block; background:#0b0f13; border-radius:3px; margin:8px 0; }
  canvas.mem { width:260px; height:44px; display:block; background:#0b0f13; border-radius:3px; }
  #detail .msg { color:var(--dim); font-size:12px; margin-top:4px; }
  #detail h3 { font-size:12px; color:var(--dim); font-weight:normal; margin:10px 0 4px; text-transform:uppercase; }
  button.pager { background:none; color:var(--dim); border-color:#444; text-transform:none; }
  button { background:#3d1d1d; color:var(--bad); border:1px solid #6e2b2b; border-radius:4px; padding:1px 8px; cursor:pointer; font-size:12px; }
  #events td { font-size:12px; } #events td.time { color:var(--dim); white-space:nowrap; }
  .empty { color:var(--dim); font-style:italic; }
  .hidden { display:none !important; }
</style>
</head>
<body data-ready="0">
<header><h1>Strata</h1><span class="dim" id="endpoint"></span><span class="dim" id="conn">connecting...</span></header>
<main>
  <div class="top">
    <section><h2>Runs</h2><div class="runlist" id="runs"></div></section>
    <section id="detail" data-run-id="">
      <div class="title" style="display:flex;justify-content:space-between;gap:8px"><b id="d-title" class="empty">no run selected</b><span id="d-state"></span></div>
      <div class="line" id="d-plan"></div>
      <div class="line" id="d-handled"></div>
      <div class="line" id="d-stats"></div>
      <div id="d-extract" class="hidden"><div class="bar" style="margin-top:8px;height:18px"><div class="prog"></div><span class="progtext" style="line-height:18px"></span></div></div>
      <canvas class="loss" data-points="0"></canvas>
      <div class="msg" id="d-msg"></div>
      <div id="d-memory"></div>
      <h3>Events of this run</h3>
      <div style="max-height:280px;overflow:auto"><table><thead><tr><th>time</th><th>event</th><th>message</th></tr></thead><tbody id="events"></tbody></table></div>
    </section>
  </div>
  <section><h2>Workers <span id="wcount"></span> <span id="wpager" hidden><button class="pager" id="wprev">&lsaquo;</button> <button class="pager" id="wnext">&rsaquo;</button></span></h2>
    <table><thead><tr><th>worker</th><th>state</th><th>device</th><th>memory now (used / allocated / total)</th><th>allocated, last 10 min</th><th>peak</th><th>heartbeat</th><th>run</th></tr></thead>
    <tbody id="workers"></tbody></table>
  </section>
</main>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({"&":"&amp;","<":"&lt;",">":"&gt;","\"":"&quot;","'":"&#39;"}[c]));
function bytes(n) {
  if (!n) return "0 B";
  const u = ["B","KiB","MiB","GiB","TiB"]; let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return n.toFixed(n < 10 && i ? 1 : 0) + " " + u[i];
}
function duration(s) {
  if (s == null || !isFinite(s)) return "-";
  s = Math.round(s); const h = Math.floor(s / 3600), m = Math.floor(s % 3600 / 60), x = s % 60;
  return (h ? h + ":" + String(m).padStart(2, "0") : m) + ":" + String(x).padStart(2, "0");
}
const pct = (a, b) => b > 0 ? Math.max(0, Math.min(100, 100 * a / b)) : 0;

function drawMemory(canvas, samples, nowMs, estimate) {
  const dpr = window.devicePixelRatio || 1, W = canvas.clientWidth || 260, H = canvas.clientHeight || 44;
  canvas.width = W * dpr; canvas.height = H * dpr;
  const g = canvas.getContext("2d"); g.scale(dpr, dpr); g.clearRect(0, 0, W, H);
  canvas.dataset.samples = String(samples.length);
  g.font = "10px system-ui, sans-serif"; g.fillStyle = "#8a98a8";
  if (!samples.length) { g.fillText("no heartbeat yet", 6, H / 2 + 3); return; }
  // The worker's own tensors over the last 10 minutes (or since its first sample, at least a
  // minute wide); the dashed line is its rank's estimate.
  const span = Math.min(600000, Math.max(60000, nowMs - samples[0][0])), t0 = nowMs - span;
  const hi = Math.max(1, estimate || 0, ...samples.map((m) => m[2])) * 1.15;
  const x = (t) => W * Math.max(0, t - t0) / span, y = (v) => H - 2 - (H - 12) * v / hi;
  if (estimate) {
    g.strokeStyle = "#d29922"; g.setLineDash([3, 3]); g.beginPath();
    g.moveTo(0, y(estimate)); g.lineTo(W, y(estimate)); g.stroke(); g.setLineDash([]);
  }
  g.strokeStyle = "#58a6ff"; g.lineWidth = 1.5; g.beginPath();
  samples.forEach((m, i) => i ? g.lineTo(x(m[0]), y(m[2])) : g.moveTo(x(m[0]), y(m[2])));
  g.stroke();
  g.fillText("max " + bytes(Math.max(...samples.map((m) => m[2]))) + (estimate ? " / est " + bytes(estimate) : ""), 4, 10);
}

function renderWorkers(workers, runs, nowMs) {
  if (!workers.length) { $("workers").innerHTML = '<tr><td colspan="8" class="empty">no worker has registered</td></tr>'; return; }
  const tbody = $("workers"), key = workers.map((w) => w.id).join("|");
  if (tbody.dataset.key !== key) {
    tbody.dataset.key = key;
    tbody.innerHTML = workers.map((w) => `<tr data-worker-id="${esc(w.id)}">
      <td><b>${esc(w.id)}</b><div style="font-size:11px;color:var(--dim)" class="host"></div></td>
      <td><span class="badge wstate"></span></td><td class="device"></td>
      <td><div class="bar"><div class="used"></div><div class="alloc"></div><span></span></div></td>
      <td><canvas class="mem" data-samples="0"></canvas></td>
      <td class="peak"></td><td class="hb"></td><td class="wrun"></td></tr>`).join("");
  }
  // A busy worker's rank estimate, from its run's per-rank memory.
  const estimates = {};
  for (const r of runs) if (r.state === "running") for (const m of r.memory || []) estimates[m.worker] = m.estimate;
  for (const w of workers) {
    const row = tbody.querySelector(`tr[data-worker-id="${CSS.escape(w.id)}"]`);
    const m = w.memory, used = Math.max(0, m.total - m.free);
    row.dataset.state = w.state;
    row.querySelector(".host").textContent = `${w.host} pid ${w.pid}`;
    const badge = row.querySelector(".wstate"); badge.className = "badge wstate s-" + w.state; badge.textContent = w.state;
    row.querySelector(".device").textContent = w.device;
    row.querySelector(".bar").title = "free " + bytes(m.free);
    row.querySelector(".used").style.width = pct(used, m.total) + "%";
    row.querySelector(".alloc").style.width = pct(m.allocated, m.total) + "%";
    row.querySelector(".bar span").textContent = `${bytes(used)} / ${bytes(m.allocated)} / ${bytes(m.total)}`;
    row.querySelector(".peak").textContent = bytes(m.peak);
    row.querySelector(".hb").textContent = (w.heartbeat_age_ms / 1000).toFixed(1) + " s ago";
    row.querySelector(".wrun").textContent = w.current_run || "-";
    drawMemory(row.querySelector("canvas.mem"), w.memory_history || [], nowMs, w.current_run ? estimates[w.id] : 0);
  }
}

function drawLoss(canvas, points) {
  const dpr = window.devicePixelRatio || 1, W = canvas.clientWidth || 400, H = canvas.clientHeight || 140;
  canvas.width = W * dpr; canvas.height = H * dpr;
  const g = canvas.getContext("2d"); g.scale(dpr, dpr); g.clearRect(0, 0, W, H);
  const pts = points.filter((p) => p[1] != null && isFinite(p[1]));
  canvas.dataset.points = String(pts.length);
  g.font = "11px system-ui, sans-serif"; g.fillStyle = "#8a98a8";
  if (!pts.length) { g.fillText("no loss reported yet", 10, H / 2); return; }
  const pad = {l: 44, r: 8, t: 8, b: 18};
  let lo = Math.min(...pts.map((p) => p[1])), hi = Math.max(...pts.map((p) => p[1]));
  if (hi - lo < 1e-9) { hi += 0.5; lo -= 0.5; }
  const maxStep = Math.max(pts[pts.length - 1][0], 2);
  const x = (s) => pad.l + (W - pad.l - pad.r) * (s - 1) / (maxStep - 1);
  const y = (v) => pad.t + (H - pad.t - pad.b) * (1 - (v - lo) / (hi - lo));
  g.strokeStyle = "#2a3540"; g.lineWidth = 1;
  for (let i = 0; i <= 3; i++) {
    const v = lo + (hi - lo) * i / 3, yy = Math.round(y(v)) + 0.5;
    g.beginPath(); g.moveTo(pad.l, yy); g.lineTo(W - pad.r, yy); g.stroke();
    g.fillText(v.toFixed(3), 4, yy + 4);
  }
  g.fillText("step " + pts[pts.length - 1][0], W - pad.r - 60, H - 4);
  g.strokeStyle = "#58a6ff"; g.lineWidth = 1.5; g.beginPath();
  pts.forEach((p, i) => i ? g.lineTo(x(p[0]), y(p[1])) : g.moveTo(x(p[0]), y(p[1])));
  g.stroke();
  if (pts.length === 1) { g.fillStyle = "#58a6ff"; g.fillRect(x(pts[0][0]) - 2, y(pts[0][1]) - 2, 4, 4); }
}

// "dp 2 · pp 1 · tp 1 · ZeRO-0 · micro-batch 4 x 1 · stages 2": the run's current plan.
function planText(p) {
  if (!p) return "";
  return `dp ${p.dp} · pp ${p.pp} · tp ${p.tp} · ZeRO-${p.zero} · micro-batch ${p.micro_batch} x ${p.gradient_accumulation}` +
    (p.recompute ? " · recompute" : "") + (p.keep_gathered > 0 ? " · keep_gathered " + p.keep_gathered : "") +
    (p.offload && p.offload !== "none" ? " · offload " + p.offload : "") +
    (p.stages && p.stages.length > 1 ? " · stages " + p.stages.join("/") : "");
}
function handledHtml(h) {
  const kinds = Object.keys(h || {});
  return kinds.map((k) => `<span class="fail ${esc(k)}" data-handled="${esc(k)}">${esc(k)} ${h[k]}</span>`).join(" ");
}
const isExtract = (r) => r.kind === "extract" || r.kind === "patch";
const rate = (b) => (b / 1e9).toFixed(b >= 1e9 ? 2 : 3) + " GB/s";
function progress(r) {
  if (isExtract(r)) {
    const x = r.extract || {rows_stored: 0, rows_total: 0};
    return [pct(x.rows_stored, x.rows_total), `rows ${x.rows_stored.toLocaleString("en")} / ${x.rows_total.toLocaleString("en")}`];
  }
  return [pct(r.step, r.total_steps), `step ${r.step} / ${r.total_steps}`];
}
function speed(r) {
  if (isExtract(r)) return `<span>speed <b>${rate((r.extract || {}).bytes_per_second || 0)}</b></span><span>rows/s <b>${Math.round(r.tokens_per_second)}</b></span>`;
  return `<span>loss <b>${r.loss == null ? "-" : Number(r.loss).toFixed(4)}</b></span>` +
    `<span>step <b>${r.step_seconds == null ? "-" : (r.step_seconds * 1000).toFixed(0) + " ms"}</b></span>` +
    `<span>tokens/s <b>${Math.round(r.tokens_per_second)}</b></span>`;
}

let selected = decodeURIComponent((location.hash.match(/run=([^&]+)/) || [])[1] || "");
const active = (r) => r.state === "running" || r.state === "pending";

// Workers whose checkpoint write waits for disk space (their last save-paused not followed by a
// save-resumed): the run trains on, holding the checkpoint in host memory.
function savesWaiting(r) {
  if (r.state !== "running") return [];
  const last = {};
  for (const e of r.events || []) {
    if (e.kind !== "save-paused" && e.kind !== "save-resumed") continue;
    const worker = e.message.split(": ")[0];
    if (e.kind === "save-resumed") delete last[worker]; else last[worker] = e.message;
  }
  return Object.values(last);
}

function renderRuns(runs) {
  // Active runs first, then the most recent others; compact cards so many fit above the fold.
  const shown = runs.filter(active).concat(runs.filter((r) => !active(r)).reverse());
  const box = $("runs");
  if (!shown.length) { box.innerHTML = '<div class="empty">no runs yet: <code>strata submit SPEC.toml</code></div>'; return null; }
  if (!shown.some((r) => r.id === selected)) selected = shown[0].id;
  box.innerHTML = shown.map((r) => {
    const [p, text] = progress(r), hurt = Object.keys(r.handled || {}).length > 0;
    return `<div class="run${r.id === selected ? " selected" : ""}${hurt ? " hurt" : ""}" data-run-id="${esc(r.id)}" data-kind="${esc(r.kind)}" data-state="${esc(r.state)}" data-step="${r.step}">
      <div class="title"><b title="${esc(r.id)}">${esc(r.name)} <span style="color:var(--dim);font-weight:normal">${esc(r.id)}</span></b>
        <span><span class="badge s-${esc(r.state)}">${esc(r.state)}</span>${active(r) ? ' <button class="cancel">cancel</button>' : ""}</span></div>
      <div class="bar"><div class="prog" style="width:${p}%"></div><span class="progtext">${text} (${p.toFixed(0)}%)</span></div>
      <div class="line">${speed(r)}${isExtract(r) ? "<span><b>extract</b></span>" : `<span class="plan"><b>${esc(planText(r.plan))}</b></span>`}</div>
      ${hurt ? `<div class="line">handled ${handledHtml(r.handled)}</div>` : ""}
      ${savesWaiting(r).map((m) => `<div class="line bad" data-save-paused="1" title="${esc(m)}">saving paused: ${esc(m)}</div>`).join("")}</div>`;
  }).join("");
  return shown.find((r) => r.id === selected);
}

function renderDetail(r) {
  const d = $("detail");
  if (!r) { d.dataset.runId = ""; return; }
  d.dataset.runId = r.id;
  $("d-title").className = ""; $("d-title").textContent = `${r.name} (${r.id})`;
  $("d-state").innerHTML = `<span class="badge s-${esc(r.state)}">${esc(r.state)}</span>`;
  $("d-plan").innerHTML = isExtract(r) ? "<span>extract run: captures activations, no training</span>"
    : `<span>plan <b>${esc(planText(r.plan) || "not planned yet")}</b></span>`;
  const h = handledHtml(r.handled);
  $("d-handled").innerHTML = `<span>failures handled ${h || "<b>none</b>"}</span>`;
  const x = r.extract || {};
  $("d-stats").innerHTML = speed(r) + (isExtract(r) ? `<span>stored <b>${bytes(x.bytes_stored)}</b></span>`
    : `<span>ETA <b>${r.state === "running" ? duration(r.eta_seconds) : "-"}</b></span><span>checkpoints <b>${r.checkpoints}</b></span>`) +
    `<span>workers <b>${esc(r.workers.join(", ") || "-")}</b></span>`;
  $("d-msg").textContent = r.message || "";
  const canvas = d.querySelector("canvas.loss");
  $("d-extract").classList.toggle("hidden", !isExtract(r)); canvas.classList.toggle("hidden", isExtract(r));
  if (isExtract(r)) {
    const [p, text] = progress(r);
    $("d-extract").querySelector(".prog").style.width = p + "%";
    $("d-extract").querySelector(".progtext").textContent = `${text} (${p.toFixed(0)}%) · ${rate(x.bytes_per_second || 0)}`;
  } else {
    drawLoss(canvas, r.loss_points);
  }
  const mem = r.memory || [];
  $("d-memory").innerHTML = mem.length ? `<h3>Memory per rank (estimate vs measured peak)</h3><table><thead><tr><th>rank</th><th>worker</th><th>estimate</th><th>measured peak</th><th></th></tr></thead><tbody>` +
    mem.map((m, i) => `<tr data-rank="${i}"><td>${i}</td><td>${esc(m.worker)}</td><td>${bytes(m.estimate)}</td><td>${m.measured_peak ? bytes(m.measured_peak) : "-"}</td>
      <td><div class="bar" style="min-width:120px"><div class="alloc" style="width:${pct(m.measured_peak, Math.max(m.estimate, m.measured_peak))}%"></div>
      <span>${m.estimate && m.measured_peak ? (100 * m.measured_peak / m.estimate).toFixed(0) + "% of estimate" : ""}</span></div></td></tr>`).join("") + "</tbody></table>" : "";
  const events = r.events.slice().reverse();
  $("events").dataset.count = String(events.length); $("events").dataset.run = r.id;
  $("events").innerHTML = events.length ? events.map((e) => `<tr data-kind="${esc(e.kind)}">
      <td class="time">${new Date(e.unix_ms).toLocaleTimeString()}</td>
      <td><span class="badge">${esc(e.kind)}</span></td><td>${esc(e.message)}</td></tr>`).join("")
    : '<tr><td colspan="3" class="empty">no events</td></tr>';
}

// /api/state lists the workers a page at a time (a cluster may have thousands); counts cover all.
const kWorkerPage = 100;
let workerOffset = 0;
function renderWorkerCount(s) {
  const total = s.workers_total ?? s.workers.length, by = s.workers_by_state || {};
  if (!s.workers.length && total && workerOffset) { workerOffset = 0; refresh(); return; }  // the page emptied
  const shown = total > kWorkerPage ? ` · ${s.workers.length ? workerOffset + 1 : 0}-${workerOffset + s.workers.length} shown` : "";
  $("wcount").textContent = `${total} (${by.idle || 0} idle, ${by.busy || 0} busy, ${by.lost || 0} lost)${shown}`;
  $("wpager").hidden = total <= kWorkerPage;
  $("wprev").disabled = workerOffset === 0;
  $("wnext").disabled = workerOffset + kWorkerPage >= total;
}
$("wprev").addEventListener("click", () => { workerOffset = Math.max(0, workerOffset - kWorkerPage); refresh(); });
$("wnext").addEventListener("click", () => { workerOffset += kWorkerPage; refresh(); });

let last = null;
function render(s) {
  renderDetail(renderRuns(s.runs)); renderWorkers(s.workers, s.runs, s.unix_ms); renderWorkerCount(s);
}
$("runs").addEventListener("click", (ev) => {
  const card = ev.target.closest(".run");
  if (!card) return;
  if (ev.target.closest("button.cancel")) { cancelRun(card.dataset.runId); return; }
  selected = card.dataset.runId; history.replaceState(null, "", "#run=" + encodeURIComponent(selected));
  if (last) render(last);
});

async function cancelRun(id) {
  let token = sessionStorage.getItem("strata-token");
  if (!token) { token = prompt("Dashboard token (the contents of STATE_DIR/http.token):"); if (!token) return; }
  const res = await fetch(`/api/runs/${encodeURIComponent(id)}/cancel`, {method: "POST", headers: {Authorization: "Bearer " + token}});
  if (res.status === 401) { sessionStorage.removeItem("strata-token"); alert("wrong token"); return; }
  sessionStorage.setItem("strata-token", token);
  if (!res.ok) alert(await res.text());
  refresh();
}

let asked = false;
async function refresh() {
  try {
    // A dashboard bound beyond loopback wants the token for reads too (401): ask once per tab.
    const token = sessionStorage.getItem("strata-token");
    const res = await fetch(`/api/state?workers_offset=${workerOffset}&workers_limit=${kWorkerPage}`, {cache: "no-store", headers: token ? {Authorization: "Bearer " + token} : {}});
    if (res.status === 401 && !asked) {
      asked = true;
      const t = prompt("This dashboard needs its token to show anything (the contents of STATE_DIR/http.token):");
      if (t) { sessionStorage.setItem("strata-token", t); asked = false; return refresh(); }
    }
    if (!res.ok) throw new Error("HTTP " + res.status + ": " + (await res.text()).trim());
    const s = await res.json();
    $("endpoint").textContent = "coordinator " + s.endpoint;
    $("conn").textContent = "updated " + new Date(s.unix_ms).toLocaleTimeString(); $("conn").className = "dim";
    last = s; render(s);
    document.body.dataset.ready = "1";
  } catch (e) {
    $("conn").textContent = "coordinator unreachable (" + e.message + ")"; $("conn").className = "dim bad";
  }
}
refresh();
setInterval(refresh, 1000);
</script>
</body>
</html>
)HTML";
  return kPage;
}

}  // namespace strata::coordinator
