// dtq dashboard: history charts, schedules, rate limits, and a task's chain and group.
// Loaded after app.js and uses its helpers (el, api, post, table, ...). Charts are drawn
// by uPlot (uPlot.iife.min.js, MIT). Every value is inserted as text.
"use strict";

// ---------------------------------------------------------------- history
const CHARTS = [
  { id: "chart-outcomes", title: "Tasks per sample (1 min by default)",
    series: [["enqueued", "#2456c9"], ["succeeded", "#1d7a3a"], ["failed", "#a15c00"],
      ["dead_lettered", "#b3261e"]] },
  { id: "chart-backlog", title: "Backlog: depth (left) and oldest age in s (right)",
    series: [["depth", "#2456c9"], ["backlog_age_s", "#a15c00", "s"]] },
  { id: "chart-wait", title: "Queue wait (ms): p50, p95, p99",
    series: [["wait_p50", "#1d7a3a"], ["wait_p95", "#a15c00"], ["wait_p99", "#b3261e"]] },
  { id: "chart-run", title: "Run time (ms): p50, p95, p99",
    series: [["run_p50", "#1d7a3a"], ["run_p95", "#a15c00"], ["run_p99", "#b3261e"]] },
];

function historyColumns(points) {
  const pct = (p, key, i) => (p[key] && p[key].length ? p[key][i] : null);
  const col = {
    t: points.map((p) => p.t / 1000),
    enqueued: points.map((p) => p.enqueued), succeeded: points.map((p) => p.succeeded),
    failed: points.map((p) => p.failed), dead_lettered: points.map((p) => p.dead_lettered),
    depth: points.map((p) => p.depth),
    backlog_age_s: points.map((p) => p.backlog_age_ms / 1000),
  };
  ["wait", "run"].forEach((k) => ["p50", "p95", "p99"].forEach((name, i) => {
    col[k + "_" + name] = points.map((p) => pct(p, k + "_ms", i));
  }));
  return col;
}

function drawChart(box, spec, col, intervalS) {
  // one sample alone: a window of one interval either side, not uPlot's default years
  const x = { time: true, range: (u, min, max) => (min === max ? [min - intervalS,
    max + intervalS] : [min, max]) };
  const scales = spec.series.some((s) => s[2]) ? { x, y: {}, s: {} } : { x, y: {} };
  const opts = {
    width: Math.max(320, Math.min(660, box.clientWidth || 660)), height: 220,
    title: spec.title, scales,
    series: [{}].concat(spec.series.map(([label, stroke, scale]) =>
      ({ label, stroke, width: 2, scale: scale || "y", spanGaps: true }))),
    axes: [{}, { scale: "y" }].concat(scales.s ? [{ scale: "s", side: 1,
      grid: { show: false } }] : []),
  };
  const data = [col.t].concat(spec.series.map(([label]) => col[label]));
  // what each line adds up to, for people and tests reading the page
  box.dataset.sums = JSON.stringify(Object.fromEntries(spec.series.map(([label]) =>
    [label, col[label].reduce((a, v) => a + (v || 0), 0)])));
  return new uPlot(opts, data, box); // eslint-disable-line no-undef
}

async function historyView(params) {
  const queue = params.get("queue") || "";
  const minutes = params.get("minutes") || "60";
  const data = await api("/api/history" + qs({ queue, minutes }));
  const qIn = el("input", { name: "queue", value: queue, placeholder: "all queues" });
  const mIn = el("select", { name: "minutes" }, ["60", "120", "360", "1440"].map((m) =>
    el("option", { value: m, selected: m === minutes }, m + " min")));
  const form = el("form", { class: "toolbar", id: "history-filter" },
    el("label", {}, "queue", qIn), el("label", {}, "last", mIn),
    el("button", { type: "submit" }, "Show"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    location.hash = "#/history" + qs({ queue: qIn.value.trim(), minutes: mIn.value });
  });
  const pts = data.points;
  const sum = (k) => pts.reduce((a, p) => a + (p[k] || 0), 0);
  const boxes = CHARTS.map((c) => el("div", { class: "chart", id: c.id }));
  show(el("h1", {}, "History", queue ? " of " + queue : " (all queues)"), form,
    el("div", { class: "cards", id: "history-totals" },
      card("samples", pts.length), card("enqueued", sum("enqueued")),
      card("succeeded", sum("succeeded")), card("failed", sum("failed")),
      card("dead-lettered", sum("dead_lettered"))),
    pts.length ? el("div", { class: "charts" }, boxes)
      : el("p", { class: "muted", id: "history-empty" }, "No samples yet: the scheduler " +
        "leader stores one every " + dur(data.interval_ms) + "."),
    el("p", { class: "muted" }, "One sample every " + dur(data.interval_ms) + ", taken by " +
      "the scheduler leader and kept in Redis: the same from every gateway. Wait and run " +
      "percentiles are of the tasks created in each sample's interval (at most 1000 read)."));
  if (pts.length) {
    const col = historyColumns(pts);
    CHARTS.forEach((c, i) => drawChart(boxes[i], c, col, data.interval_ms / 1000));
  }
  autoRefresh();
}

// ---------------------------------------------------------------- schedules
function every(s) {
  if (s.cron) return "cron " + s.cron + (s.timezone ? " (" + s.timezone + ")" : "");
  return "every " + dur(s.interval_ms);
}

async function schedulesView(params) {
  const data = await api("/api/schedules" + qs({ page_size: 100,
    page_token: params.get("page_token") || "" }));
  const act = (name, action) => async () => {
    const r = await post("/api/schedules/" + encodeURIComponent(name) + "/" + action, {});
    flash("schedule " + name + ": " + action + (r.task_id ? " → task " + r.task_id : ""));
    route();
  };
  const rows = data.schedules.map((s) => el("tr", { "data-schedule": s.name },
    el("td", {}, s.name), el("td", {}, every(s)),
    el("td", {}, link("#/queues/" + encodeURIComponent(s.queue), s.queue)),
    el("td", {}, s.task_type), el("td", {}, s.paused ? badge("paused") : badge("live")),
    el("td", { class: "next-fire" }, s.paused ? el("span", { class: "muted" }, "paused")
      : ago(s.next_fire_ms)),
    el("td", { class: "last-fire" }, ago(s.last_fire_ms)),
    el("td", {}, s.last_task_id ? link("#/tasks/" + s.last_task_id,
      s.last_task_id.slice(0, 12) + "…") : ""),
    num(s.fires_total),
    el("td", { class: "actions" },
      s.paused ? actionButton("Resume", "primary resume", act(s.name, "resume"))
        : confirmButton("Pause", "danger pause", act(s.name, "pause")), " ",
      confirmButton("Trigger", "trigger", act(s.name, "trigger")), " ",
      confirmButton("Delete", "danger delete", act(s.name, "delete")))));
  show(el("h1", {}, "Schedules"),
    table(["schedule", "timetable", "queue", "task type", "state", "next fire",
      "last fire", "last task", "fires#", ""], rows, "schedules"),
    el("p", { class: "muted" }, "Pause, Trigger and Delete act on a second click within " +
      "4 s; each is audited. Times: Redis clock."),
    data.next_page_token ? link("#/schedules?page_token=" +
      encodeURIComponent(data.next_page_token), "More schedules →") : null);
  autoRefresh();
}

// ---------------------------------------------------------------- rate limits
async function rateLimitsView(params) {
  const queue = params.get("queue") || "";
  const data = await api("/api/rate-limits" + qs({ page_size: 100, queue,
    page_token: params.get("page_token") || "" }));
  const inputs = {
    queue: el("input", { name: "queue", value: queue, placeholder: "queue", required: true }),
    task_type: el("input", { name: "task_type", placeholder: "every type" }),
    limit: el("input", { name: "limit", type: "number", min: 1, placeholder: "leases" }),
    period_ms: el("input", { name: "period_ms", type: "number", min: 1,
      placeholder: "1000" }),
    burst: el("input", { name: "burst", type: "number", min: 1, placeholder: "= limit" }),
  };
  const form = el("form", { class: "toolbar", id: "rate-limit-form" },
    Object.entries(inputs).map(([k, input]) => el("label", {}, k.replace("_", " "), input)),
    el("button", { type: "submit", class: "primary" }, "Set limit"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const body = { queue: inputs.queue.value.trim(), task_type: inputs.task_type.value.trim() };
    for (const k of ["limit", "period_ms", "burst"]) {
      if (inputs[k].value !== "") body[k] = Number(inputs[k].value);
    }
    try {
      const r = await post("/api/rate-limits", body);
      flash("rate limit " + (r.created ? "set" : "changed") + ": " + r.rate_limit.queue +
        " " + (r.rate_limit.task_type || "*"));
      route();
    } catch (e) { flash(e.message, true); }
  });
  const rows = data.rate_limits.map((r) => el("tr", {
    "data-limit": r.queue + " " + (r.task_type || "*") },
  el("td", {}, link("#/queues/" + encodeURIComponent(r.queue), r.queue)),
  el("td", {}, r.task_type || el("span", { class: "muted" }, "* (whole queue)")),
  num(r.limit), num(dur(r.period_ms)), num(r.burst), num(r.tokens.toFixed(1)),
  el("td", {}, confirmButton("Delete", "danger delete", async () => {
    await post("/api/rate-limits/delete", { queue: r.queue, task_type: r.task_type });
    flash("rate limit deleted: " + r.queue + " " + (r.task_type || "*")); route();
  }))));
  show(el("h1", {}, "Rate limits"), form,
    table(["queue", "task type", "limit#", "per#", "burst#", "tokens now#", ""], rows,
      "rate-limits"),
    data.next_page_token ? link("#/rate-limits" + qs({ queue,
      page_token: data.next_page_token }), "More limits →") : null);
}

// ---------------------------------------------------------------- task: chain and group
async function taskLinks(t) {
  if (!t.chain_id && !t.group_id) return;
  const host = document.getElementById("main");
  let links;
  try {
    links = await api("/api/tasks/" + encodeURIComponent(t.task_id) + "/links");
  } catch (e) { // the task itself is shown; say why its chain or group is not
    if (e.status !== 401) host.append(el("p", { class: "error-text" }, "chain / group: " + e.message));
    return;
  }
  const taskCell = (id, current) => !id ? el("span", { class: "muted" }, "not created yet")
    : current ? el("strong", {}, id.slice(0, 12) + "… (this task)")
      : link("#/tasks/" + id, id.slice(0, 12) + "…");
  if (links.chain) {
    host.append(el("section", { id: "task-chain" }, el("h2", {}, "Chain"), table(["step#", "task", "queue", "type", "status"],
      links.chain.steps.map((s) => el("tr", { "data-step": s.step },
        num(s.step), el("td", {}, taskCell(s.task_id, s.task_id === t.task_id)),
        el("td", {}, s.queue), el("td", {}, s.task_type),
        el("td", {}, badge(s.status.toLowerCase())))), "chain"),
    links.chain.more ? el("p", { class: "muted" }, "Longer chain: the first 50 steps shown.")
      : null));
  }
  const g = links.group;
  if (g) {
    const cb = g.callback;
    host.append(el("section", { id: "task-group" }, el("h2", {}, "Group"),
      el("p", { id: "group-summary" }, "group " + g.group_id.slice(0, 12) + "… · " +
        g.state.toLowerCase() + " · " + g.done + " of " + g.total + " members finished · " +
        "callback ", cb ? [cb.task_type + " on " + cb.queue + " ",
        cb.task_id ? link("#/tasks/" + cb.task_id, cb.task_id.slice(0, 12) + "…")
          : el("span", { class: "muted" }, "(not enqueued yet)")] : "—"),
      table(["member", "type", "status"], g.members.map((m) => el("tr", {
        "data-member": m.task_id },
      el("td", {}, taskCell(m.task_id, m.task_id === t.task_id)), el("td", {}, m.task_type),
      el("td", {}, badge(m.status.toLowerCase())))), "group"),
      g.more ? el("p", { class: "muted" }, "Larger group: the first 200 members shown.")
        : null));
  }
}
