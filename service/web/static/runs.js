// The runs list: status, reward, step time and speedup per run (GET /runs, then
// GET /run-summaries for the page), sortable by a click on a column header, with runs picked for
// the comparison view. Uses app.js's helpers ($, api, show, fmt*, badge).
"use strict";

const runsList = { runs: [], summaries: {}, sort: { key: "created", dir: -1 }, picked: new Set() };

// a run's value for each sortable column (null sorts last in either direction)
const SORT_KEYS = {
  name: (r) => r.name.toLowerCase(),
  recipe: (r) => r.recipe || "",
  schedule: (r) => r.schedule,
  status: (r) => r.status,
  updates: (r) => r.updates_done,
  reward: (r, s) => s?.value ?? null,
  step: (r, s) => s?.step_s_median ?? null,
  speedup: (r, s) => s?.speedup ?? null,
  created: (r) => r.created_at,
};

function sortedRuns() {
  const { key, dir } = runsList.sort;
  const value = (r) => SORT_KEYS[key](r, runsList.summaries[r.id]);
  return [...runsList.runs].sort((a, b) => {
    const va = value(a), vb = value(b);
    if (va == null || vb == null) return va == null ? (vb == null ? 0 : 1) : -1;
    return (va < vb ? -1 : va > vb ? 1 : 0) * dir;
  });
}

function cell(content, title) {
  const td = document.createElement("td");
  if (content instanceof Node) td.append(content); else td.textContent = content;
  if (title) td.title = title;
  return td;
}

function speedupCell(run, s) {
  if (s?.speedup == null) {
    const why = run.schedule === "sync" ? "a sync run is the baseline itself"
      : s?.baseline_id ? "no step times yet" : "no sync run of this recipe to compare with: submit one with schedule sync";
    return cell("–", why);
  }
  const a = document.createElement("a");
  a.href = `#/compare/${s.baseline_id},${run.id}`;
  a.textContent = s.speedup.toFixed(2) + "×";
  a.title = "compare with its sync baseline";
  a.onclick = (ev) => ev.stopPropagation();
  return cell(a);
}

function runRow(r) {
  const s = runsList.summaries[r.id];
  const tr = document.createElement("tr");
  tr.className = "run-row"; tr.dataset.id = r.id;
  const pick = document.createElement("input");
  pick.type = "checkbox"; pick.className = "pick-run"; pick.checked = runsList.picked.has(r.id);
  pick.setAttribute("aria-label", "pick " + r.name + " to compare");
  pick.onclick = (ev) => ev.stopPropagation();
  pick.onchange = () => { pick.checked ? runsList.picked.add(r.id) : runsList.picked.delete(r.id); updateCompareButton(); };
  const status = document.createElement("span"); badge(status, r.status);
  const metric = s && s.metric !== "reward_mean" ? `${s.metric} (the objective's target)` : "mean reward of the last update";
  tr.append(
    cell(pick), cell(r.name), cell(r.recipe || "(config)"), cell(r.schedule), cell(status),
    cell(`${r.updates_done}/${r.updates_total}`), cell(fmtNum(s?.value), metric),
    cell(fmtS(s?.step_s_median), "median step time"), speedupCell(r, s), cell(fmtTime(r.created_at)),
  );
  tr.onclick = () => { location.hash = "#/runs/" + r.id; };
  return tr;
}

function drawRuns() {
  const { key, dir } = runsList.sort;
  for (const th of $("runs-table").querySelectorAll("th[data-sort]")) {
    th.classList.toggle("sorted", th.dataset.sort === key);
    th.dataset.dir = th.dataset.sort === key ? (dir > 0 ? "asc" : "desc") : "";
    th.setAttribute("aria-sort", th.dataset.sort === key ? (dir > 0 ? "ascending" : "descending") : "none");
  }
  $("runs-table").querySelector("tbody").replaceChildren(...sortedRuns().map(runRow));
  $("runs-empty").hidden = runsList.runs.length > 0;
  updateCompareButton();
}

function updateCompareButton() {
  const ids = runsList.runs.map((r) => r.id).filter((id) => runsList.picked.has(id));
  $("compare-runs").disabled = ids.length < 2;
  $("compare-runs").textContent = ids.length ? `Compare selected (${ids.length})` : "Compare selected";
}

async function loadRuns() {
  const runs = await api("/runs?limit=100");
  runsList.runs = runs.data;
  if (runs.data.length) {
    const q = runs.data.map((r) => "ids=" + r.id).join("&");
    const sums = await api("/run-summaries?" + q);
    runsList.summaries = Object.fromEntries(sums.data.map((s) => [s.run_id, s]));
  }
  drawRuns();
}

async function renderRuns() {
  show("runs-view");
  await loadRuns();
  listTimer = setInterval(() => loadRuns().catch(() => {}), 2000);
}

for (const th of $("runs-table").querySelectorAll("th[data-sort]")) {
  th.tabIndex = 0;
  const resort = () => {
    const s = runsList.sort;
    runsList.sort = { key: th.dataset.sort, dir: s.key === th.dataset.sort ? -s.dir : 1 };
    drawRuns();
  };
  th.onclick = resort;
  th.onkeydown = (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); resort(); } };
}
$("compare-runs").onclick = () => {
  const ids = sortedRuns().map((r) => r.id).filter((id) => runsList.picked.has(id));
  if (ids.length >= 2) location.hash = "#/compare/" + ids.join(",");
};
