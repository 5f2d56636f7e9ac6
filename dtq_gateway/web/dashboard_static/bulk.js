// dtq dashboard: the Search page and the Bulk actions page (CancelTasks, PurgeQueue,
// SearchTasks through /api/search, /api/tasks/cancel-matching, /api/queues/<q>/purge).
// Loaded after app.js, whose helpers (el, api, post, qs, show, flash, table, taskTable,
// confirmButton, actionButton) it uses; app.js's router calls window.dtqViews[name].
"use strict";

// "k=v, k2=v2" -> {k: "v", k2: "v2"} (pairs without "=" are ignored)
function metaPairs(text) {
  const out = {};
  for (const part of (text || "").split(",")) {
    const i = part.indexOf("=");
    if (i > 0) out[part.slice(0, i).trim()] = part.slice(i + 1).trim();
  }
  return out;
}
function metaText(meta) {
  return Object.entries(meta || {}).map(([k, v]) => k + "=" + v).join(", ");
}
function field(label, input) { return el("label", {}, label, input); }
function minutesMs(v) { const n = Number(v); return n > 0 ? Math.round(n * 60000) : 0; }

async function searchView(params) {
  const p = (k) => params.get(k) || "";
  const inputs = {
    queue: el("input", { name: "queue", value: p("queue"), placeholder: "any" }),
    type: el("input", { name: "type", value: p("type"), placeholder: "any" }),
    status: el("select", { name: "status" }, ["", "QUEUED", "SCHEDULED", "ACTIVE",
      "SUCCEEDED", "DEAD_LETTERED", "CANCELLED", "EXPIRED"].map((s) =>
      el("option", { value: s, selected: s === p("status") }, s || "any"))),
    meta: el("input", { name: "meta", value: p("meta"), placeholder: "k=v, k2=v2" }),
    newer: el("input", { name: "newer", value: p("newer"), placeholder: "any",
      size: 6 }),
  };
  const form = el("form", { class: "toolbar", id: "search-form" },
    field("queue", inputs.queue), field("type", inputs.type), field("status", inputs.status),
    field("metadata", inputs.meta), field("newer than (min)", inputs.newer),
    el("button", { type: "submit", class: "primary" }, "Search"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    location.hash = "#/search" + qs({ queue: inputs.queue.value.trim(),
      type: inputs.type.value.trim(), status: inputs.status.value,
      meta: inputs.meta.value.trim(), newer: inputs.newer.value.trim() });
  });
  const filter = { queue: p("queue"), task_type: p("type"),
    statuses: p("status") ? [p("status")] : [], metadata: metaPairs(p("meta")),
    max_age_ms: minutesMs(p("newer")) };
  const data = await post("/api/search", { filter, page_size: 50,
    page_token: p("page") });
  const rows = data.tasks.map((t) => el("tr", { "data-task": t.task_id },
    el("td", {}, link("#/tasks/" + t.task_id, t.task_id)), el("td", {}, t.queue),
    el("td", {}, t.task_type), el("td", {}, badge(t.status.toLowerCase())),
    el("td", {}, when(t.created_at_ms)), el("td", { class: "preview" }, metaText(t.metadata))));
  const next = data.next_page_token ? new URLSearchParams(params) : null;
  if (next) next.set("page", data.next_page_token);
  show(el("h1", {}, "Search tasks"), form,
    table(["task", "queue", "type", "status", "created", "metadata"], rows, "search-results"),
    el("p", { class: "muted", id: "search-cost" }, data.examined +
      " entries of the recent-tasks index read for this page (at most 1000 per page)."),
    next ? link("#/search?" + next.toString(), "Next page →") : null);
}

async function bulkView(params) {
  const queue = el("input", { name: "queue", id: "bulk-queue", value: params.get("queue") || "",
    placeholder: "queue (required)" });
  const type = el("input", { name: "type", id: "bulk-type", placeholder: "any" });
  const status = el("select", { name: "status", id: "bulk-status" },
    ["", "QUEUED", "SCHEDULED"].map((s) => el("option", { value: s }, s || "queued + scheduled")));
  const meta = el("input", { name: "meta", id: "bulk-meta", placeholder: "k=v, k2=v2" });
  const older = el("input", { name: "older", id: "bulk-older", placeholder: "any", size: 6 });
  const outcome = el("p", { id: "bulk-outcome", class: "muted" },
    "Bulk actions cancel waiting (queued or scheduled) tasks only; running tasks go on.");
  const filter = () => ({ queue: queue.value.trim(), task_type: type.value.trim(),
    statuses: status.value ? [status.value] : [], metadata: metaPairs(meta.value),
    min_age_ms: minutesMs(older.value) });
  const count = actionButton("Count matches", "", async () => {
    const r = await post("/api/tasks/cancel-matching", { filter: filter(), dry_run: true });
    outcome.textContent = r.matched + " waiting task(s) match";
  });
  count.id = "bulk-count";
  const cancel = confirmButton("Cancel matching", "danger", async () => {
    const r = await post("/api/tasks/cancel-matching",
      { filter: filter(), reason: "cancelled from the dashboard" });
    outcome.textContent = "cancelled " + r.cancelled + " of " + r.matched +
      " matching task(s) (request " + r.request_id + ")";
    flash("cancelled " + r.cancelled + " task(s)");
  });
  cancel.id = "bulk-cancel";
  const purge = confirmButton("Purge queue", "danger", async () => {
    const q = queue.value.trim();
    const r = await post("/api/queues/" + encodeURIComponent(q) + "/purge",
      { reason: "purged from the dashboard" });
    outcome.textContent = "purged " + q + ": cancelled " + r.cancelled +
      " waiting task(s) (request " + r.request_id + ")";
    flash("purged " + q);
  });
  purge.id = "bulk-purge";
  show(el("h1", {}, "Bulk actions"),
    el("form", { class: "toolbar", id: "bulk-form", onsubmit: (ev) => ev.preventDefault() },
      field("queue", queue), field("type", type), field("status", status),
      field("metadata", meta), field("older than (min)", older)),
    el("div", { class: "toolbar" }, count, cancel, purge), outcome,
    el("p", {}, link("#/audit", "Audit entries →")));
}

window.dtqViews = Object.assign(window.dtqViews || {}, { search: searchView, bulk: bulkView });

// the header's search box: "k=v" searches metadata, anything else a task type
document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("search-box");
  if (!form) return;
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const text = document.getElementById("search-box-text").value.trim();
    location.hash = "#/search" + qs(text.includes("=") ? { meta: text } : { type: text });
  });
});
