// ThunderSync dashboard: the token, the API helper, routing and the live run page (SSE over fetch,
// so the token travels in the Authorization header and never in a URL). The runs list, the submit
// form and the comparison view are in runs.js, submit.js and compare.js. Charts: vendored Chart.js.
"use strict";

const API = "/api/v1";
const LANES = ["rollout", "tool", "teacher", "learner", "barrier"];
const LANE_COLORS = { rollout: "#4dabf7", tool: "#ffa94d", teacher: "#b197fc", learner: "#51cf66", barrier: "#ff6b6b" };
const TIMELINE_UPDATES = 3;
const MAX_BARS = 3000;
const $ = (id) => document.getElementById(id);
function el(tag, props = {}, ...children) {
  const e = Object.assign(document.createElement(tag), props);
  e.append(...children);
  return e;
}

// --- token ---------------------------------------------------------------------------------------
function takeTokenFromUrl() {
  // `/#token=...` (never sent to the server) or `/?token=...`; moved into localStorage, then removed.
  const hash = new URLSearchParams(location.hash.replace(/^#\/?/, ""));
  const query = new URLSearchParams(location.search);
  const t = hash.get("token") || query.get("token");
  if (t) {
    localStorage.setItem("tsrl_token", t);
    // keep a run's route (`/?token=...#/runs/ID`, the link `make run` prints)
    const keep = location.hash.startsWith("#/runs/") ? location.hash : "#/";
    history.replaceState(null, "", location.pathname + keep);
  }
}
const token = () => localStorage.getItem("tsrl_token");

async function api(path, opts = {}) {
  const headers = Object.assign({ Authorization: "Bearer " + token() }, opts.headers || {});
  if (opts.body) headers["Content-Type"] = "application/json";
  const res = await fetch(API + path, Object.assign({}, opts, { headers }));
  if (res.status === 401) { showLogin("token rejected (401): paste a valid token"); throw new Error("401"); }
  const body = res.headers.get("content-type")?.includes("json") ? await res.json() : null;
  if (!res.ok) {
    const d = body?.detail;
    const err = new Error(Array.isArray(d) ? d.map((e) => e.msg).join("; ") : (d || res.statusText));
    err.status = res.status; err.detail = d;  // a 422's detail names the fields (submit.js)
    throw err;
  }
  return body;
}

function show(section) {
  for (const id of ["login", "runs-view", "submit-view", "compare-view", "run-view"]) $(id).hidden = id !== section;
}
function showLogin(msg) {
  stopStream(); show("login"); $("login-error").textContent = msg || ""; $("signout").hidden = true;
}

// --- formatting ------------------------------------------------------------------------------------
const fmtS = (v) => (v == null ? "–" : v < 1 ? (v * 1000).toFixed(0) + " ms" : v.toFixed(2) + " s");
const fmtPct = (v) => (v == null ? "–" : (v * 100).toFixed(1) + "%");
const fmtNum = (v) => (v == null ? "–" : Math.abs(v) >= 100 ? v.toFixed(0) : v.toPrecision(3));
const fmtTime = (iso) => (iso ? new Date(iso).toLocaleString() : "");
function badge(el, status) { el.textContent = status; el.className = "badge " + status; }

// --- run page ----------------------------------------------------------------------------------------
let charts = {};
let stream = null;
let listTimer = null;  // the runs list's refresh (runs.js)
let state = null;
// an update's step time and its parts (seconds; metrics.jsonl names, see docs/CONTRACTS.md)
const STEP_PARTS = [
  ["step_s", "step", "#3b5bdb"],
  ["rollout_s", "rollout (to the last close)", "#2b8a3e"],
  ["learner_busy_s", "learner busy", "#e8590c"],
  ["barrier_s", "barrier (reduce + step + publish)", "#862e9c"],
];

function lineChart(canvas, label, color, extra = {}) {
  return new Chart(canvas, {
    type: "line",
    data: { labels: [], datasets: [{ label, data: [], borderColor: color, backgroundColor: color, pointRadius: 2, tension: 0.2 }] },
    options: Object.assign({ animation: false, maintainAspectRatio: false, plugins: { legend: { display: false } },
      scales: { x: { title: { display: true, text: "update" } } } }, extra),
  });
}

function makeCharts() {
  for (const c of Object.values(charts)) c.destroy();
  charts = {
    timeline: new Chart($("timeline-chart"), {
      type: "bar",
      data: { labels: LANES, datasets: LANES.map((role) => ({ label: role, data: [], backgroundColor: LANE_COLORS[role], borderSkipped: false, barPercentage: 0.8, categoryPercentage: 1, grouped: false })) },
      options: { indexAxis: "y", animation: false, maintainAspectRatio: false,
        plugins: { legend: { position: "bottom" }, tooltip: { callbacks: { label: (c) => `${c.raw.kind || c.dataset.label} u${c.raw.update}: ${c.raw.x[0].toFixed(3)}–${c.raw.x[1].toFixed(3)} s` } } },
        scales: { x: { type: "linear", title: { display: true, text: "seconds" } } } },
    }),
    step: new Chart($("step-chart"), {
      type: "line",
      data: { labels: [], datasets: STEP_PARTS.map(([, label, color]) => ({ label, data: [], borderColor: color, backgroundColor: color, pointRadius: 2, tension: 0.2 })) },
      options: { animation: false, maintainAspectRatio: false, plugins: { legend: { position: "bottom" } },
        scales: { x: { title: { display: true, text: "update" } }, y: { min: 0, title: { display: true, text: "seconds" } } } },
    }),
    reward: lineChart($("reward-chart"), "mean reward", "#2b8a3e"),
    kl: lineChart($("kl-chart"), "mean token KL to the teacher", "#5f3dc4"),
    idle: lineChart($("idle-chart"), "idle share", "#e8590c", { scales: { y: { min: 0, max: 1 } } }),
    mfu: lineChart($("mfu-chart"), "MFU", "#862e9c"),
    ttt: new Chart($("ttt-chart"), {
      type: "line",
      data: { datasets: [
        { label: "this run", data: [], borderColor: "#2b8a3e", backgroundColor: "#2b8a3e", pointRadius: 2 },
        { label: "sync baseline", data: [], borderColor: "#868e96", backgroundColor: "#868e96", pointRadius: 2, borderDash: [4, 3] },
        { label: "target", data: [], borderColor: "#e03131", pointRadius: 0, borderWidth: 1 },
      ] },
      options: { animation: false, maintainAspectRatio: false, plugins: { legend: { position: "bottom" } },
        scales: { x: { type: "linear", title: { display: true, text: "seconds" } }, y: { title: { display: true, text: "mean reward" } } } },
    }),
  };
}

function stopStream() {
  if (stream) { stream.abort(); stream = null; }
  if (listTimer) { clearInterval(listTimer); listTimer = null; }
}

async function renderRun(id) {
  show("run-view");
  state = { id, updates: [], spans: [], t0: null, cursor: { update: -1, span: 0, log: 0 }, status: null };
  $("run-logs").textContent = ""; $("updates-done").textContent = "0";
  makeCharts();
  $("ttt-target").onchange = (ev) => { ev.target.dataset.user = "1"; refreshTimeToTarget(); };
  Object.assign($("ttt-target"), { value: "0.5", step: "0.05" }); delete $("ttt-target").dataset.user;
  const run = await api("/runs/" + id);
  applyRun(run);
  $("run-config").textContent = JSON.stringify(run.config, null, 2);
  $("cancel-run").onclick = async () => {
    try { applyRun(await api(`/runs/${id}/cancel`, { method: "POST" })); } catch (e) { $("run-reason").textContent = String(e.message); }
  };
  follow(id);
}

function applyRun(run) {
  state.status = run.status;
  $("run-name").textContent = run.name;
  badge($("run-status"), run.status);
  $("run-reason").textContent = run.reason + (run.cancel_requested && run.status === "running" ? " (cancel requested: stops at the next barrier)" : "");
  $("updates-done").textContent = run.updates_done;
  $("updates-total").textContent = run.updates_total;
  $("cancel-run").hidden = !["queued", "starting", "running"].includes(run.status) || run.cancel_requested;
}

function applyUpdates(rows) {
  state.updates.push(...rows);
  const u = state.updates;
  const labels = u.map((r) => r.update);
  const set = (chart, values) => { chart.data.labels = labels; chart.data.datasets[0].data = values; chart.update("none"); };
  charts.step.data.labels = labels;
  STEP_PARTS.forEach(([key], i) => { charts.step.data.datasets[i].data = u.map((r) => r[key]); });
  charts.step.update("none");
  set(charts.reward, u.map((r) => r.reward_mean));
  applyKl(u);
  set(charts.idle, u.map((r) => r.idle_share));
  set(charts.mfu, u.map((r) => r.mfu));
  const last = u[u.length - 1];
  $("mean-step").textContent = fmtS(u.reduce((a, r) => a + r.step_s, 0) / u.length);
  $("last-parts").textContent = STEP_PARTS.slice(1).map(([key]) => fmtS(last[key])).join(" / ");
  $("idle-share").textContent = fmtPct(last.idle_share);
  $("mfu").textContent = fmtPct(last.mfu);
  $("reward").textContent = fmtNum(last.reward_mean);
  applyDrops(u);
  applyScores(last);
  refreshSpeedup();
}

// rollout.on_failure: drop: totals over the updates, reasons (with counts) in the tooltip
function applyDrops(u) {
  const sum = (key) => u.reduce((a, r) => a + (r[key] || 0), 0);
  const reasons = {};
  u.forEach((r) => Object.entries(r.drop_reasons || {}).forEach(([k, n]) => { reasons[k] = (reasons[k] || 0) + n; }));
  const el = $("dropped");
  el.textContent = `${sum("dropped_trajectories")} / ${sum("dropped_groups")}`;
  const why = Object.entries(reasons).map(([k, n]) => `${k}: ${n}`).join("\n");
  el.title = why ? `dropped by reason:\n${why}` : "nothing dropped (rollout.on_failure: drop)";
}

// named scores (terminal reward.json) of the last update: "name value" each, hidden when none
function applyScores(last) {
  const named = Object.entries(last.scores || {});
  $("scores-card").hidden = !named.length;
  $("scores").textContent = named.map(([k, v]) => `${k} ${fmtNum(v)}`).join(" · ");
}

// OPD: KL per update, and the time-to-target card on KL (reached at kl_mean <= target); until the
// user sets a target, it is half the first update's KL
function applyKl(u) {
  const opd = u.some((r) => r.kl_mean != null);
  $("kl-box").hidden = !opd;
  if (!opd) return;
  charts.kl.data.labels = u.map((r) => r.update);
  charts.kl.data.datasets[0].data = u.map((r) => r.kl_mean);
  charts.kl.update("none");
  const input = $("ttt-target");
  if (!input.dataset.user && u[0].kl_mean != null) {
    input.value = Number((u[0].kl_mean / 2).toPrecision(2));
    input.step = "any"; input.setAttribute("aria-label", "target mean token KL (reached at or below)");
  }
}

async function refreshTimeToTarget() {
  const target = Number($("ttt-target").value);
  if (!Number.isFinite(target)) { $("ttt").textContent = "target?"; return; }
  try {
    const r = await api(`/runs/${state.id}/time-to-target?target=${target}`);
    const pts = (c) => c.map((p) => ({ x: p.t, y: p.value }));
    const kl = r.metric === "kl_mean";
    $("ttt-metric").textContent = kl ? "KL ≤" : "reward";
    $("ttt-title").textContent = kl ? "KL to the teacher" : "Reward";
    charts.ttt.options.scales.y.title.text = kl ? "mean token KL to the teacher" : "mean reward";
    const [mine, base, line] = charts.ttt.data.datasets;
    mine.data = pts(r.curve); base.data = pts(r.baseline_curve);
    const xs = [...mine.data, ...base.data].map((p) => p.x);
    line.data = xs.length ? [{ x: 0, y: target }, { x: Math.max(...xs), y: target }] : [];
    charts.ttt.update("none");
    $("ttt").textContent = r.ratio != null ? r.ratio.toFixed(2) + "×"
      : r.baseline_id == null ? "no sync run"
      : r.time_to_target_s == null ? "not reached" : "sync not reached";
  } catch (e) { /* shown on the next update */ }
}

async function refreshSpeedup() {
  refreshTimeToTarget();
  try {
    const s = await api(`/runs/${state.id}/speedup`);
    $("speedup").textContent = s.speedup == null ? (state.updates.length ? "no sync run" : "–") : s.speedup.toFixed(2) + "×";
  } catch (e) { /* shown on the next update */ }
}

function applySpans(msg) {
  if (msg.t0 != null) state.t0 = state.t0 == null ? msg.t0 : Math.min(state.t0, msg.t0);
  state.spans.push(...msg.data);
  const newest = state.spans.reduce((m, s) => Math.max(m, s.update), 0);
  state.spans = state.spans.filter((s) => s.update > newest - TIMELINE_UPDATES).slice(-MAX_BARS);
  const t0 = state.t0 || 0;
  charts.timeline.data.datasets.forEach((ds, i) => {
    ds.data = state.spans.filter((s) => s.role === LANES[i]).map((s) => ({ x: [s.start - t0, Math.max(s.end, s.start + 1e-4) - t0], y: s.role, kind: s.kind, update: s.update }));
  });
  const shown = state.spans.map((s) => s.start - t0);
  charts.timeline.options.scales.x.min = shown.length ? Math.floor(Math.min(...shown) * 10) / 10 : undefined;
  charts.timeline.update("none");
}

// Logs panel: the per-update log by default, the driver's output (rendered by the service: each
// progress bar in its last state; a bar still moving comes as `partial`, shown as a status line).
function applyLog(msg) {
  const pre = $("run-logs");
  const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  pre.textContent = (pre.textContent + msg.text).slice(-200000);
  $("log-status").textContent = msg.partial || "";
  markLogSource();
  if (atBottom) pre.scrollTop = pre.scrollHeight;
}

function showLogSource(src) {
  if (!state || (state.logSource || "log") === src) return;
  state.logSource = src; state.cursor.log = 0;
  $("run-logs").textContent = ""; $("log-status").textContent = "";
  markLogSource();
  if (stream) { stream.abort(); stream = null; follow(state.id); }  // a finished run's stream has ended
  else if (state.status) follow(state.id);
}
function markLogSource() {
  const src = (state && state.logSource) || "log";
  for (const s of ["log", "output"]) $("log-src-" + s).setAttribute("aria-pressed", String(s === src));
}
for (const s of ["log", "output"]) $("log-src-" + s).onclick = () => showLogSource(s);

async function follow(id) {
  // Server-sent events read with fetch (EventSource cannot send an Authorization header).
  const ctrl = new AbortController();
  stream = ctrl;
  const c = state.cursor;
  try {
    const res = await fetch(`${API}/runs/${id}/events?after_update=${c.update}&after_span=${c.span}&log_offset=${c.log}&log_source=${state.logSource || "log"}`,
      { headers: { Authorization: "Bearer " + token(), Accept: "text/event-stream" }, signal: ctrl.signal });
    if (res.status === 401) return showLogin("token rejected (401)");
    if (!res.ok) throw new Error(res.statusText);
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, cut); buf = buf.slice(cut + 2);
        let event = "message"; const data = [];
        for (const line of block.split("\n")) {
          if (line.startsWith("event:")) event = line.slice(6).trim();
          else if (line.startsWith("data:")) data.push(line.slice(5).trim());
        }
        if (!data.length) continue;
        const msg = JSON.parse(data.join("\n"));
        if (event === "run") applyRun(msg);
        else if (event === "updates") { applyUpdates(msg); c.update = msg[msg.length - 1].update; }
        else if (event === "spans") { applySpans(msg); c.span = msg.data[msg.data.length - 1].id; }
        else if (event === "log") { applyLog(msg); c.log = msg.next_offset; }
        else if (event === "end") { stream = null; refreshSpeedup(); return; }
      }
    }
  } catch (e) {
    if (ctrl.signal.aborted) return;
  }
  if (stream === ctrl) setTimeout(() => { if (stream === ctrl) follow(id); }, 2000);  // reconnect
}

// --- routing --------------------------------------------------------------------------------------
async function route() {
  stopStream();
  takeTokenFromUrl();
  if (!token()) return showLogin();
  $("signout").hidden = false;
  try {
    const me = await api("/tokens/me");
    $("whoami").textContent = `token: ${me.name} (${me.public_id})`;
    const m = location.hash.match(/^#\/runs\/([0-9a-f-]{36})/);
    const cmp = location.hash.match(/^#\/compare\/([0-9a-f,-]+)/);
    if (m) await renderRun(m[1]);
    else if (cmp) await renderCompare(cmp[1].split(",").filter(Boolean));
    else if (location.hash.startsWith("#/new")) await renderSubmit();
    else await renderRuns();
  } catch (e) {
    if (String(e.message) !== "401") $("whoami").textContent = "error: " + e.message;
  }
}

$("login-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  localStorage.setItem("tsrl_token", $("token-input").value.trim());
  $("token-input").value = "";
  location.hash = "#/"; route();
});
$("signout").onclick = () => { localStorage.removeItem("tsrl_token"); showLogin(); };
window.addEventListener("hashchange", route);
document.addEventListener("DOMContentLoaded", route);  // after runs.js, submit.js and compare.js
