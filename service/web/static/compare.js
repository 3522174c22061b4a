// Run comparison (#/compare/ID,ID,...): the runs' reward against wall time and their step times on
// shared charts, with a summary table; a sync run is drawn dashed and grey, as the baseline the
// others are measured against. Uses app.js's helpers ($, api, show, fmt*, badge).
"use strict";

const COMPARE_COLORS = ["#3b5bdb", "#2b8a3e", "#e8590c", "#862e9c", "#c2255c", "#0b7285", "#5c940d"];
let compareCharts = [];

function compareChart(canvas, xTitle, yTitle) {
  return new Chart(canvas, {
    type: "line",
    data: { datasets: [] },
    options: { animation: false, maintainAspectRatio: false, parsing: false,
      plugins: { legend: { position: "bottom" } },
      scales: { x: { type: "linear", title: { display: true, text: xTitle } }, y: { title: { display: true, text: yTitle } } } },
  });
}

function runDataset(run, points, i) {
  const sync = run.schedule === "sync";
  const color = sync ? "#868e96" : COMPARE_COLORS[i % COMPARE_COLORS.length];
  return { label: `${run.name} (${run.schedule})`, data: points, borderColor: color, backgroundColor: color,
    borderDash: sync ? [5, 4] : [], pointRadius: 2, tension: 0.15 };
}

async function renderCompare(ids) {
  show("compare-view");
  for (const c of compareCharts) c.destroy();
  const q = ids.map((id) => "ids=" + id).join("&");
  const [runs, sums, updates] = await Promise.all([
    Promise.all(ids.map((id) => api("/runs/" + id))),
    api("/run-summaries?" + q),
    Promise.all(ids.map((id) => api(`/runs/${id}/updates?limit=1000`))),
  ]);
  const summary = Object.fromEntries(sums.data.map((s) => [s.run_id, s]));
  $("compare-table").querySelector("tbody").replaceChildren(...runs.map((r) => {
    const s = summary[r.id];
    const name = el("a", { href: "#/runs/" + r.id, textContent: r.name });
    const status = el("span"); badge(status, r.status);
    const speedup = s?.speedup != null ? s.speedup.toFixed(2) + "×" : r.schedule === "sync" ? "baseline" : "–";
    return el("tr", {}, ...[name, r.schedule, status, `${r.updates_done}/${r.updates_total}`,
      fmtNum(s?.value), fmtS(s?.step_s_median), speedup].map((c) => el("td", {}, c)));
  }));
  const reward = compareChart($("compare-reward-chart"), "seconds", "mean reward");
  const step = compareChart($("compare-step-chart"), "update", "step time (s)");
  runs.forEach((r, i) => {
    const u = updates[i].data;
    const t0 = u.length ? u[0].time - u[0].step_s : 0;  // the start of update 0, as the run page's curve
    reward.data.datasets.push(runDataset(r, u.map((x) => ({ x: x.time - t0, y: x.reward_mean })), i));
    step.data.datasets.push(runDataset(r, u.map((x) => ({ x: x.update, y: x.step_s })), i));
  });
  reward.update("none"); step.update("none");
  compareCharts = [reward, step];
}
