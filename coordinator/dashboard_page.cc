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
  #conn.bad { color:var(--bad); }
  main { padding:16px 20px; display:grid; gap:16px; }
  section { background:var(--panel); border:1px solid var(--line); border-radius:6px; padding:12px 16px; }
  h2 { font-size:14px; margin:0 0 10px; color:var(--dim); text-transform:uppercase; letter-spacing:.05em; }
  table { width:100%; border-collapse:collapse; }
  th, td { text-align:left; padding:4px 8px; border-bottom:1px solid var(--line); vertical-align:middle; }
  th { color:var(--dim); font-weight:normal; font-size:12px; }
  .badge { display:inline-block; padding:1px 8px; border-radius:10px; font-size:12px; background:var(--line); }
  .s-idle, .s-finished { background:#1f3a27; color:var(--ok); }
  .s-busy, .s-running { background:#3a311a; color:var(--busy); }
  .s-lost, .s-failed { background:#3d1d1d; color:var(--bad); }
  .s-cancelled, .s-pending { background:#262f3a; color:var(--dim); }
  .bar { position:relative; height:14px; background:#0b0f13; border-radius:3px; overflow:hidden; min-width:160px; }
  .bar > div { position:absolute; top:0; bottom:0; left:0; }
  .bar .used { background:#2f5d8a; } .bar .alloc { background:var(--accent); }
  .bar .prog { background:var(--ok); }
  .bar span { position:absolute; left:6px; top:0; font-size:11px; line-height:14px; white-space:nowrap; }
  .runs { display:grid; grid-template-columns:repeat(auto-fill, minmax(420px, 1fr)); gap:12px; }
  .run { border:1px solid var(--line); border-radius:6px; padding:10px 12px; }
  .run .title { display:flex; justify-content:space-between; align-items:center; gap:8px; }
  .run .title b { overflow:hidden; text-overflow:ellipsis; white-space:nowrap; }
  .run .stats { display:flex; flex-wrap:wrap; gap:14px; color:var(--dim); font-size:12px; margin:6px 0; }
  .run .stats b { color:var(--text); font-weight:600; }
  .run canvas { width:100%; height:140px; display:block; background:#0b0f13; border-radius:3px; }
  .run .msg { color:var(--dim); font-size:12px; margin-top:4px; }
  button { background:#3d1d1d; color:var(--bad); border:1px solid #6e2b2b; border-radius:4px; padding:2px 10px; cursor:pointer; }
  #events td { font-size:12px; } #events td.time { color:var(--dim); white-space:nowrap; }
  .empty { color:var(--dim); font-style:italic; }
</style>
</head>
<body data-ready="0">
<header><h1>Strata</h1><span class="dim" id="endpoint"></span><span class="dim" id="conn">connecting...</span></header>
<main>
  <section><h2>Workers</h2>
    <table><thead><tr><th>worker</th><th>state</th><th>device</th><th>memory (used / allocated / total)</th><th>peak</th><th>heartbeat</th><th>run</th></tr></thead>
    <tbody id="workers"></tbody></table>
  </section>
  <section><h2>Runs</h2><div class="runs" id="runs"></div></section>
  <section><h2>Event log</h2>
    <table><thead><tr><th>time</th><th>run</th><th>event</th><th>message</th></tr></thead><tbody id="events"></tbody></table>
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

function renderWorkers(workers) {
  if (!workers.length) { $("workers").innerHTML = '<tr><td colspan="7" class="empty">no worker has registered</td></tr>'; return; }
  $("workers").innerHTML = workers.map((w) => {
    const m = w.memory, used = Math.max(0, m.total - m.free);
    return `<tr data-worker-id="${esc(w.id)}" data-state="${esc(w.state)}">
      <td><b>${esc(w.id)}</b><div class="dim" style="font-size:11px;color:var(--dim)">${esc(w.host)} pid ${w.pid}</div></td>
      <td><span class="badge s-${esc(w.state)}">${esc(w.state)}</span></td>
      <td>${esc(w.device)}</td>
      <td><div class="bar" title="free ${bytes(m.free)}"><div class="used" style="width:${pct(used, m.total)}%"></div>
          <div class="alloc" style="width:${pct(m.allocated, m.total)}%"></div>
          <span>${bytes(used)} / ${bytes(m.allocated)} / ${bytes(m.total)} (free ${bytes(m.free)})</span></div></td>
      <td>${bytes(m.peak)}</td>
      <td>${(w.heartbeat_age_ms / 1000).toFixed(1)} s ago</td>
      <td>${esc(w.current_run) || '<span class="empty">-</span>'}</td></tr>`;
  }).join("");
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

function renderRuns(runs) {
  const active = (r) => r.state === "running" || r.state === "pending";
  // Active runs first, then the most recent others.
  const shown = runs.filter(active).concat(runs.filter((r) => !active(r)).reverse()).slice(0, 12);
  const box = $("runs");
  if (!shown.length) { box.innerHTML = '<div class="empty">no runs yet: <code>strata submit SPEC.toml</code></div>'; return; }
  // Rebuild only when the set of cards changes, so canvases are not recreated every second.
  const key = shown.map((r) => r.id).join("|");
  if (box.dataset.key !== key) {
    box.dataset.key = key;
    box.innerHTML = shown.map((r) => `<div class="run" data-run-id="${esc(r.id)}">
      <div class="title"><b title="${esc(r.id)}">${esc(r.name)} <span style="color:var(--dim);font-weight:normal">${esc(r.id)}</span></b>
        <span><span class="badge state"></span> <button class="cancel" style="display:none">cancel</button></span></div>
      <div class="bar" style="margin-top:8px"><div class="prog"></div><span class="progtext"></span></div>
      <div class="stats"></div><canvas class="loss" data-points="0"></canvas><div class="msg"></div></div>`).join("");
    box.querySelectorAll("button.cancel").forEach((b) => b.addEventListener("click", () => cancelRun(b.closest(".run").dataset.runId)));
  }
  for (const r of shown) {
    const el = box.querySelector(`.run[data-run-id="${CSS.escape(r.id)}"]`);
    el.dataset.state = r.state; el.dataset.step = r.step;
    const badge = el.querySelector(".state"); badge.className = "badge state s-" + r.state; badge.textContent = r.state;
    el.querySelector(".cancel").style.display = active(r) ? "" : "none";
    el.querySelector(".prog").style.width = pct(r.step, r.total_steps) + "%";
    el.querySelector(".progtext").textContent = `step ${r.step} / ${r.total_steps} (${pct(r.step, r.total_steps).toFixed(0)}%)`;
    el.querySelector(".stats").innerHTML =
      `<span>loss <b>${r.loss == null ? "-" : Number(r.loss).toFixed(4)}</b></span>` +
      `<span>tokens/s <b>${Math.round(r.tokens_per_second)}</b></span>` +
      `<span>ETA <b>${r.state === "running" ? duration(r.eta_seconds) : "-"}</b></span>` +
      `<span>workers <b>${esc(r.workers.join(", ") || "-")}</b></span>` +
      `<span>checkpoints <b>${r.checkpoints}</b></span>`;
    el.querySelector(".msg").textContent = r.message || "";
    drawLoss(el.querySelector("canvas"), r.loss_points);
  }
}

function renderEvents(runs) {
  const all = [];
  for (const r of runs) for (const e of r.events) all.push({...e, run: r.id});
  all.sort((a, b) => b.unix_ms - a.unix_ms);
  const rows = all.slice(0, 100);
  $("events").dataset.count = String(all.length);
  $("events").innerHTML = rows.length ? rows.map((e) => `<tr data-kind="${esc(e.kind)}">
      <td class="time">${new Date(e.unix_ms).toLocaleTimeString()}</td><td>${esc(e.run)}</td>
      <td><span class="badge">${esc(e.kind)}</span></td><td>${esc(e.message)}</td></tr>`).join("")
    : '<tr><td colspan="4" class="empty">no events</td></tr>';
}

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
    const res = await fetch("/api/state", {cache: "no-store", headers: token ? {Authorization: "Bearer " + token} : {}});
    if (res.status === 401 && !asked) {
      asked = true;
      const t = prompt("This dashboard needs its token to show anything (the contents of STATE_DIR/http.token):");
      if (t) { sessionStorage.setItem("strata-token", t); asked = false; return refresh(); }
    }
    if (!res.ok) throw new Error("HTTP " + res.status + ": " + (await res.text()).trim());
    const s = await res.json();
    $("endpoint").textContent = "coordinator " + s.endpoint;
    $("conn").textContent = "updated " + new Date(s.unix_ms).toLocaleTimeString(); $("conn").className = "dim";
    renderWorkers(s.workers); renderRuns(s.runs); renderEvents(s.runs);
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
