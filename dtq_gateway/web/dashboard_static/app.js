// dtq dashboard: plain JavaScript over the gateway's JSON API (/api/...), no build step.
// Every value from the API is inserted as text (el() / textContent), never as HTML:
// payloads, task types, errors, labels and host names are written by clients.
"use strict";

const TOKEN_KEY = "dtq.token";
const TERMINAL = new Set(["succeeded", "dead_lettered", "cancelled", "expired"]);
const EVENT_TYPES = ["TASK_QUEUED", "TASK_STARTED", "TASK_SUCCEEDED", "TASK_FAILED",
  "TASK_RETRY_SCHEDULED", "TASK_RETRIED", "TASK_DEAD_LETTERED", "TASK_CANCELLED",
  "TASK_EXPIRED", "TASK_DUPLICATE_ABSORBED", "WORKER_STARTED", "WORKER_STOPPED",
  "WORKER_STALE", "CONFIGURATION_CHANGED"];
let info = { auth_required: false };
let refreshTimer = null;
let feed = null; // AbortController of the open live feed

// ---------------------------------------------------------------- DOM helpers
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "class") node.className = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}
const main = () => document.getElementById("main");
function show(...nodes) {
  main().replaceChildren(...nodes.flat(Infinity).filter((n) => n !== null && n !== undefined &&
    n !== false));
}
function flash(text, isError) {
  const box = document.getElementById("flash");
  box.textContent = text;
  box.className = isError ? "error" : "";
  clearTimeout(flash.timer);
  flash.timer = setTimeout(() => box.classList.add("hidden"), isError ? 10000 : 5000);
}
function badge(text) { return el("span", { class: "badge " + text }, text); }
function link(href, text) { return el("a", { href }, text); }
function table(headers, rows, cls) {
  return el("table", { class: cls || "" },
    el("thead", {}, el("tr", {}, headers.map((h) =>
      el("th", { class: h.endsWith("#") ? "num" : "" }, h.replace(/#$/, ""))))),
    el("tbody", {}, rows.length ? rows : el("tr", {},
      el("td", { colspan: headers.length, class: "muted" }, "nothing here"))));
}
function num(v) { return el("td", { class: "num" }, v); }
function card(label, value) {
  return el("div", { class: "card" }, el("div", { class: "value" }, value),
    el("div", { class: "label" }, label));
}

// ---------------------------------------------------------------- formatting
function dur(ms) {
  if (!ms || ms < 0) return "0 s";
  if (ms < 1000) return ms + " ms";
  const s = ms / 1000;
  if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + " s";
  if (s < 3600) return (s / 60).toFixed(1) + " min";
  if (s < 86400) return (s / 3600).toFixed(1) + " h";
  return (s / 86400).toFixed(1) + " d";
}
function when(ms) {
  if (!ms) return el("span", { class: "muted" }, "—");
  const d = new Date(ms);
  const ago = Date.now() - ms;
  const rel = ago >= 0 ? dur(ago) + " ago" : "in " + dur(-ago);
  return el("span", { title: d.toISOString() }, d.toISOString().replace("T", " ").slice(0, 19) +
    " (" + rel + ")");
}
// A compact time: "3.2 min ago" on one line, the full UTC time in its title.
function ago(ms) {
  if (!ms) return el("span", { class: "muted" }, "—");
  const age = Date.now() - ms;
  return el("span", { class: "time", title: new Date(ms).toISOString() },
    age >= 0 ? dur(age) + " ago" : "in " + dur(-age));
}
function decoded(p) {
  if (!p || p.encoding === "empty") return el("span", { class: "muted" }, "(empty)");
  const value = p.encoding === "json" ? JSON.stringify(p.value, null, 2) : p.value;
  return el("div", {}, el("pre", { class: "payload" }, value),
    el("div", { class: "muted" }, p.encoding + ", " + p.bytes + " bytes"));
}
function preview(p) {
  if (!p || p.encoding === "empty") return "";
  const text = p.encoding === "json" ? JSON.stringify(p.value) : p.value;
  return p.truncated ? text + "… (" + p.bytes + " bytes)" : text;
}
function perMin(r, key) { return r ? r[key + "_per_min"] : 0; }

// ---------------------------------------------------------------- API
class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || ("HTTP " + status));
    this.status = status;
    this.code = e.code;
    this.field = e.field;
  }
}
function headers(json) {
  const h = { Accept: "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) h.Authorization = "Bearer " + token;
  if (json) h["Content-Type"] = "application/json";
  return h;
}
async function api(path, opts) {
  const method = (opts && opts.method) || "GET";
  const init = { method, headers: headers(method !== "GET"), credentials: "omit" };
  if (method !== "GET") init.body = JSON.stringify((opts && opts.body) || {});
  const resp = await fetch(path, init);
  let body = null;
  try { body = await resp.json(); } catch (_) { body = null; }
  if (!resp.ok) {
    const err = new ApiError(resp.status, body);
    if (resp.status === 401) loginView(err.message);
    throw err;
  }
  return body;
}
const post = (path, body) => api(path, { method: "POST", body });
function qs(params) {
  const u = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== "" && v != null) u.set(k, v);
  const s = u.toString();
  return s ? "?" + s : "";
}
// A button that acts on the second click (the first arms it for 4 s).
function confirmButton(text, cls, action) {
  const b = el("button", { class: cls, type: "button" }, text);
  b.addEventListener("click", async () => {
    if (!b.classList.contains("armed")) {
      b.classList.add("armed");
      b.textContent = "Confirm " + text.toLowerCase();
      setTimeout(() => { b.classList.remove("armed"); b.textContent = text; }, 4000);
      return;
    }
    b.disabled = true;
    try { await action(); } catch (e) { flash(e.message, true); b.disabled = false; }
  });
  return b;
}
function actionButton(text, cls, action) {
  const b = el("button", { class: cls, type: "button" }, text);
  b.addEventListener("click", async () => {
    b.disabled = true;
    try { await action(); } catch (e) { flash(e.message, true); }
    b.disabled = false;
  });
  return b;
}

// ---------------------------------------------------------------- views
function loginView(message) {
  stopTimers();
  const input = el("input", { type: "password", id: "token", placeholder: "admin token",
    autocomplete: "off" });
  const form = el("form", { class: "login", id: "login" },
    el("h1", {}, "Sign in"),
    el("p", { class: "muted" }, "This gateway requires an admin token (DTQ_AUTH_TOKENS). " +
      "It is kept in this tab's session storage and sent as an Authorization header."),
    message ? el("p", { class: "error-text" }, message) : null,
    input, el("button", { class: "primary", type: "submit" }, "Sign in"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    document.getElementById("logout").classList.remove("hidden");
    route();
  });
  show(form);
  input.focus();
}

async function queuesView(params) {
  const after = params.get("after") || "";
  const data = await api("/api/queues" + qs({ page_size: 200, page_token: after }));
  const bands = [9, 8, 7, 6, 5, 4, 3, 2, 1, 0];
  const rows = data.queues.map((q) => {
    const byBand = Object.fromEntries(q.bands.map((b) => [b.band, b]));
    return el("tr", { "data-queue": q.name },
      el("td", {}, link("#/queues/" + encodeURIComponent(q.name), q.name)),
      el("td", {}, q.paused ? badge("paused") : badge("live")),
      num(q.depth), num(q.pending), num(dur(q.backlog_age_ms)),
      bands.map((b) => {
        const x = byBand[b] || { depth: 0, pending: 0 };
        return el("td", { class: "band" + (x.depth ? " full" : ""),
          title: "p" + b + ": " + x.depth + " entries, " + x.pending + " leased" }, x.depth);
      }),
      num(perMin(q.rates, "enqueued")), num(perMin(q.rates, "succeeded")),
      num(perMin(q.rates, "failed")));
  });
  show(el("h1", {}, "Queues"),
    table(["queue", "state", "depth#", "leased#", "backlog age#",
      ...bands.map((b) => "p" + b), "enq/min#", "ok/min#", "failed/min#"], rows, "queues"),
    el("p", { class: "muted" }, "Depth = entries in the band streams (waiting + leased). " +
      "Backlog age = age of the oldest entry not yet leased. Rates: last 60 s, all gateways."),
    data.next_page_token ? link("#/queues?after=" + encodeURIComponent(data.next_page_token),
      "More queues →") : null);
  autoRefresh();
}

async function queueView(name) {
  const q = await api("/api/queues/" + encodeURIComponent(name));
  const pause = q.paused
    ? actionButton("Resume", "primary", async () => {
      await post("/api/queues/" + encodeURIComponent(name) + "/resume", {});
      flash("queue " + name + " resumed"); route();
    })
    : confirmButton("Pause", "danger", async () => {
      await post("/api/queues/" + encodeURIComponent(name) + "/pause",
        { reason: "paused from the dashboard" });
      flash("queue " + name + " paused"); route();
    });
  pause.id = "pause-toggle";
  show(el("h1", {}, "Queue ", name, " ", q.paused ? badge("paused") : badge("live"), " ", pause),
    el("div", { class: "cards" },
      card("depth", q.depth), card("leased", q.pending), card("scheduled", q.scheduled),
      card("backlog age", dur(q.backlog_age_ms)),
      card("dead letters", q.dead_letter_depth),
      card("enqueued / min", perMin(q.rates, "enqueued")),
      card("succeeded / min", perMin(q.rates, "succeeded")),
      card("failed / min", perMin(q.rates, "failed")),
      card("succeeded", q.succeeded), card("failed", q.failed),
      card("cancelled", q.cancelled)),
    q.stuck_task_types.length ? el("p", { class: "error", id: "stuck-types" },
      "Stuck: no live worker takes task type(s) " + q.stuck_task_types.join(", ") +
      " (its type, or the labels the tasks require)") : null,
    el("h2", {}, "Waiting by task type"),
    table(["task type", "required labels", "waiting#", "oldest#", "taken by a live worker"],
      q.waiting_types.map((w) => el("tr", {}, el("td", {}, w.task_type),
        el("td", {}, Object.entries(w.required_labels || {}).map(([k, v]) => k + "=" + v)
          .join(", ")), num(w.waiting),
        num(dur(w.oldest_age_ms)), el("td", {}, w.taken ? "yes" : "no")))),
    q.concurrency.max_active_per_key || q.concurrency.key_count ? [
      el("h2", { id: "concurrency-keys" }, "Concurrency keys (max ",
        String(q.concurrency.max_active_per_key || "none"), " per key; ",
        String(q.concurrency.key_count), " keys in use, ", String(q.concurrency.waiting),
        " waiting)"),
      table(["key", "active#", "waiting#"], q.concurrency.keys.map((k) =>
        el("tr", {}, el("td", {}, k.key), num(k.active), num(k.waiting))))] : null,
    el("h2", {}, "Bands"),
    table(["band", "depth#", "leased#"], q.bands.map((b) =>
      el("tr", {}, el("td", {}, "p" + b.band), num(b.depth), num(b.pending)))),
    el("h2", {}, "Consumers"),
    table(["consumer (worker id)", "pending#", "idle#"], q.consumers.map((c) =>
      el("tr", {}, el("td", {}, c.name), num(c.pending), num(dur(c.idle_ms))))),
    el("h2", {}, "Recent tasks"), taskTable(q.recent),
    el("p", {}, link("#/dead-letters?queue=" + encodeURIComponent(name),
      "Dead letters of " + name), " · ", link("#/bulk?queue=" + encodeURIComponent(name),
      "Bulk actions on " + name)));
  autoRefresh();
}

function taskTable(tasks) {
  return table(["task", "type", "status", "attempt", "created", "last error"],
    tasks.map((t) => el("tr", {},
      el("td", {}, link("#/tasks/" + t.task_id, t.task_id)), el("td", {}, t.task_type),
      el("td", {}, badge(t.status.toLowerCase())), el("td", {}, attemptText(t, "/")),
      el("td", {}, when(t.created_at_ms)), el("td", { class: "preview" }, t.last_error))),
    "tasks");
}

async function recentView(params) {
  const queue = params.get("queue") || "";
  const status = params.get("status") || "";
  const data = await api("/api/recent" + qs({ limit: 100, queue, status }));
  const qIn = el("input", { name: "queue", value: queue, placeholder: "any" });
  const sIn = el("select", { name: "status" }, ["", "queued", "scheduled", "active",
    "succeeded", "dead_lettered", "cancelled", "expired"].map((s) =>
    el("option", { value: s, selected: s === status }, s || "any")));
  const form = el("form", { class: "toolbar" }, el("label", {}, "queue", qIn),
    el("label", {}, "status", sIn), el("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    location.hash = "#/recent" + qs({ queue: qIn.value.trim(), status: sIn.value });
  });
  show(el("h1", {}, "Recent tasks"), form, taskTable(data.tasks));
}

// The attempt: "2 of 3"; a task that never ran shows "none of 3 (never ran)", one still
// waiting for its first run "1 of 3 (not started)" (attempt is the current or next one).
function attemptText(t, sep) {
  if (t.started_at_ms) return t.attempt + sep + t.max_attempts;
  if (t.finished_at_ms) return "none" + sep + t.max_attempts + " (never ran)";
  return t.attempt + sep + t.max_attempts + " (not started)";
}

async function taskView(id) {
  const t = await api("/api/tasks/" + encodeURIComponent(id));
  const status = t.status.toLowerCase(); // the API writes SUCCEEDED; pages show succeeded
  const actions = [];
  if (!TERMINAL.has(status)) {
    actions.push(confirmButton("Cancel", "danger", async () => {
      const r = await post("/api/tasks/" + t.task_id + "/cancel", { reason: "dashboard" });
      flash("task " + t.task_id + ": " + r.outcome); route();
    }));
  }
  if (status === "dead_lettered" && t.metadata.discarded !== "true") {
    actions.push(dlqActions(t.task_id, route));
  }
  const kv = (k, v) => [el("dt", {}, k), el("dd", {}, v === "" || v == null ? "—" : v)];
  show(el("h1", {}, "Task ", el("code", {}, t.task_id), " ", badge(status), " ", actions),
    el("dl", { class: "kv" },
      kv("queue", link("#/queues/" + encodeURIComponent(t.queue), t.queue)),
      kv("type", t.task_type), kv("priority", t.priority),
      kv("attempt", attemptText(t, " of ")), kv("timeout", dur(t.timeout_ms)),
      kv("worker", t.worker_id), kv("idempotency key", t.idempotency_key),
      kv("created", when(t.created_at_ms)), kv("not before", when(t.not_before_ms)),
      kv("expires", when(t.expires_at_ms)), kv("started", when(t.started_at_ms)),
      kv("finished", when(t.finished_at_ms)),
      kv("cancel requested", t.cancel_requested ? "yes" : "no"),
      kv("content type", t.content_type),
      kv("progress", t.progress_at_ms ? el("span", { id: "task-progress" },
        t.progress_percent.toFixed(0) + "% " + t.progress_message + " (", when(t.progress_at_ms),
        ")") : ""),
      t.chain_id ? kv("chain", el("span", {}, "step " + t.chain_step + " of ",
        link("#/tasks/" + t.chain_id, t.chain_id.slice(0, 12) + "…"), " · " + t.chain_state.toLowerCase(),
        t.next_task_id ? el("span", {}, " · next ",
          link("#/tasks/" + t.next_task_id, t.next_task_id.slice(0, 12) + "…")) : "")) : null),
    t.last_error ? [el("h2", {}, "Last error"),
      el("pre", { class: "error" }, (t.last_error_class ? t.last_error_class + ": " : "") +
        t.last_error)] : null,
    el("h2", {}, "Payload"), decoded(t.payload),
    el("h2", {}, "Result" + (t.result_truncated ? " (truncated)" : "")), decoded(t.result),
    el("h2", {}, "Attempts"),
    table(["#", "worker", "started", "finished", "outcome", "error"],
      t.attempts.map((a) => el("tr", {}, el("td", {}, a.attempt), el("td", {}, a.worker_id),
        el("td", {}, when(a.started_at_ms)), el("td", {}, when(a.finished_at_ms)),
        el("td", {}, a.outcome),
        el("td", {}, (a.error_class ? a.error_class + ": " : "") + a.error_message))),
      "attempts"),
    el("h2", {}, "Metadata"),
    table(["key", "value"], Object.entries(t.metadata).map(([k, v]) =>
      el("tr", {}, el("td", {}, k), el("td", {}, v)))));
  await taskLinks(t); // chain and group (pages.js)
}

function dlqActions(taskId, after) {
  return el("span", { class: "actions" },
    actionButton("Requeue", "primary requeue", async () => {
      await post("/api/dead-letters/" + taskId + "/requeue", {});
      flash("task " + taskId + " requeued"); after();
    }), " ",
    confirmButton("Discard", "danger discard", async () => {
      await post("/api/dead-letters/" + taskId + "/discard", {});
      flash("dead letter of task " + taskId + " discarded"); after();
    }));
}

async function deadLettersView(params) {
  const f = { queue: params.get("queue") || "", task_type: params.get("task_type") || "",
    error_class: params.get("error_class") || "", page_token: params.get("page_token") || "" };
  const data = await api("/api/dead-letters" + qs({ ...f, page_size: 50 }));
  const inputs = {
    queue: el("input", { name: "queue", value: f.queue, placeholder: "any" }),
    task_type: el("input", { name: "task_type", value: f.task_type, placeholder: "any" }),
    error_class: el("input", { name: "error_class", value: f.error_class,
      placeholder: "any" }),
    min_age_s: el("input", { name: "min_age_s", type: "number", min: 0, value: "",
      placeholder: "0" }),
  };
  const values = () => ({ queue: inputs.queue.value.trim(),
    task_type: inputs.task_type.value.trim(), error_class: inputs.error_class.value.trim() });
  const form = el("form", { class: "toolbar", id: "dlq-filter" },
    el("label", {}, "queue", inputs.queue), el("label", {}, "task type", inputs.task_type),
    el("label", {}, "error class", inputs.error_class),
    el("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    location.hash = "#/dead-letters" + qs(values());
  });
  // Dry run and redrive use the filter applied (the one the list shows), never what is
  // typed in the boxes but not yet applied with Filter.
  const applied = { queue: f.queue, task_type: f.task_type, error_class: f.error_class };
  const filterText = Object.entries(applied).filter(([, v]) => v)
    .map(([k, v]) => k + "=" + v).join(", ") || "all dead letters";
  const outcome = el("span", { id: "redrive-outcome", class: "muted" });
  const redriveBody = (dry) => ({ ...applied, dry_run: dry,
    min_age_ms: Math.round((Number(inputs.min_age_s.value) || 0) * 1000) });
  // Redrive asks first: its first click counts the matches (a dry run) and arms the
  // button as "Confirm redrive of N"; only the second click requeues.
  const redriveButton = el("button", { class: "danger", type: "button", id: "redrive-go" },
    "Redrive");
  let armedTimer = null;
  const disarm = () => {
    clearTimeout(armedTimer);
    redriveButton.classList.remove("armed");
    redriveButton.textContent = "Redrive";
  };
  redriveButton.addEventListener("click", async () => {
    redriveButton.disabled = true;
    try {
      if (!redriveButton.classList.contains("armed")) {
        const r = await post("/api/dead-letters/redrive", redriveBody(true));
        outcome.textContent = r.matched + " dead letter(s) match " + filterText;
        if (r.matched > 0) {
          redriveButton.classList.add("armed");
          redriveButton.textContent = "Confirm redrive of " + r.matched;
          armedTimer = setTimeout(disarm, 6000);
        }
      } else {
        disarm();
        const r = await post("/api/dead-letters/redrive", redriveBody(false));
        flash("redrive: " + r.requeued + " of " + r.matched + " requeued"); route();
      }
    } catch (e) { flash(e.message, true); disarm(); }
    redriveButton.disabled = false;
  });
  const redrive = el("div", { class: "toolbar", id: "redrive" },
    el("label", {}, "older than (s)", inputs.min_age_s),
    actionButton("Dry run", "", async () => {
      const r = await post("/api/dead-letters/redrive", redriveBody(true));
      outcome.textContent = r.matched + " dead letter(s) match " + filterText;
    }),
    redriveButton, outcome);
  const rows = data.entries.map((d) => el("tr", { "data-task": d.task_id },
    el("td", {}, link("#/tasks/" + d.task_id, d.task_id.slice(0, 12) + "…")),
    el("td", {}, d.queue), el("td", {}, d.task_type), el("td", {}, d.last_error_class),
    el("td", {}, el("div", { class: "preview", title: d.last_error }, d.last_error)),
    el("td", {}, el("div", { class: "preview", title: preview(d.payload) }, preview(d.payload))),
    num(d.attempts_made), el("td", { class: "failed-at" }, ago(d.failed_at_ms)),
    el("td", {}, dlqActions(d.task_id, route))));
  const more = data.next_page_token
    ? link("#/dead-letters" + qs({ ...values(), page_token: data.next_page_token }), "Older →")
    : null;
  show(el("h1", {}, "Dead letters"), form,
    el("h2", {}, "Redrive the matching dead letters (" + filterText + ")"),
    redrive, table(["task", "queue", "type", "error class", "last error", "payload",
      "attempts#", "failed", ""], rows, "dead-letters"), more);
}

async function workersView() {
  const data = await api("/api/workers");
  show(el("h1", {}, "Workers"),
    table(["worker", "host", "state", "queues", "labels", "in flight#", "processed#",
      "failed#", "retried#", "heartbeat age#", "started"], data.workers.map((w) =>
      el("tr", { "data-worker": w.worker_id }, el("td", {}, w.worker_id),
        el("td", {}, w.hostname), el("td", {}, badge(w.status),
          // heartbeating with no Lease stream that reads (ended, or never opened)
          w.leasing ? " leasing" : (w.alive ? " connected, not leasing" : "")),
        el("td", {}, w.queues.map((q) => [link("#/queues/" + encodeURIComponent(q), q), " "])),
        el("td", {}, Object.entries(w.labels).map(([k, v]) =>
          el("span", { class: "label-chip" }, k + "=" + v))),
        num(w.in_flight + (w.concurrency ? " / " + w.concurrency : "")),
        num(w.tasks_processed), num(w.tasks_failed), num(w.tasks_retried),
        num(dur(w.heartbeat_age_ms)), el("td", {}, when(w.started_at_ms)))), "workers"));
  autoRefresh();
}

async function auditView(params) {
  const data = await api("/api/audit" + qs({ page_size: 100,
    page_token: params.get("page_token") || "" }));
  show(el("h1", {}, "Audit"),
    table(["time", "actor", "action", "task / queue", "request id", "detail"],
      data.entries.map((a) => el("tr", {}, el("td", {}, when(a.ts_ms)), el("td", {}, a.actor),
        el("td", {}, a.action), el("td", {}, a.task_id), el("td", {}, a.request_id),
        el("td", { class: "preview", title: a.detail }, a.detail)))),
    data.next_page_token ? link("#/audit?page_token=" + data.next_page_token, "Older →")
      : null);
}

function eventsView(params) {
  const qIn = el("input", { name: "queue", value: params.get("queue") || "",
    placeholder: "all queues (comma-separated)" });
  const tIn = el("select", { name: "type" }, el("option", { value: "" }, "all types"),
    EVENT_TYPES.map((t) => el("option", { value: t, selected: t === params.get("type") }, t)));
  const state = el("span", { id: "feed-state" }, badge("connecting"));
  const body = el("tbody", {});
  const form = el("form", { class: "toolbar" }, el("label", {}, "queues", qIn),
    el("label", {}, "type", tIn), el("button", { type: "submit" }, "Apply"),
    el("button", { type: "button", onclick: () => body.replaceChildren() }, "Clear"), state);
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    location.hash = "#/events" + qs({ queue: qIn.value.trim(), type: tIn.value });
  });
  show(el("h1", {}, "Live events"), form,
    el("table", { class: "event-list" }, el("thead", {}, el("tr", {},
      ["time", "type", "queue", "task", "type", "attempt", "worker", "details"].map((h) =>
        el("th", {}, h)))), body));
  openFeed(qs({ queue: qIn.value.trim(), type: tIn.value }), body, state);
}

async function openFeed(query, body, state) {
  const ctl = new AbortController();
  feed = ctl;
  let backoff = 500;
  while (!ctl.signal.aborted) {
    try {
      const resp = await fetch("/api/events" + query, { headers: headers(false),
        signal: ctl.signal, credentials: "omit" });
      if (!resp.ok) {
        const err = new ApiError(resp.status, await resp.json().catch(() => null));
        if (resp.status === 401) { loginView(err.message); return; }
        throw err;
      }
      state.replaceChildren(badge("live"));
      backoff = 500;
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const chunk = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          if (chunk.startsWith("data: ")) addEvent(body, JSON.parse(chunk.slice(6)));
        }
      }
    } catch (e) {
      if (ctl.signal.aborted) return;
      state.replaceChildren(badge("disconnected"), " " + e.message);
    }
    if (ctl.signal.aborted) return;
    state.replaceChildren(badge("reconnecting"));
    await new Promise((r) => setTimeout(r, backoff));
    backoff = Math.min(backoff * 2, 10000);
  }
}

function addEvent(body, e) {
  const details = Object.entries(e.metadata || {}).map(([k, v]) => k + "=" + v).join(" ");
  body.prepend(el("tr", { "data-type": e.type },
    el("td", {}, e.ts), el("td", {}, e.type), el("td", {}, e.queue),
    el("td", {}, e.task_id ? link("#/tasks/" + e.task_id, e.task_id.slice(0, 12) + "…") : ""),
    el("td", {}, e.task_type), el("td", {}, e.attempt || ""), el("td", {}, e.worker_id),
    el("td", { class: "preview", title: details },
      (e.dropped ? "(" + e.dropped + " events dropped before this) " : "") + details)));
  while (body.children.length > 500) body.lastElementChild.remove();
}

// ---------------------------------------------------------------- routing
function stopTimers() {
  clearTimeout(refreshTimer);
  refreshTimer = null;
  if (feed) { feed.abort(); feed = null; }
}
function autoRefresh() {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(() => {
    // not while a button waits for its confirming click: redrawing would reset it
    if (document.querySelector("button.armed")) autoRefresh();
    else route(true);
  }, 5000);
}

async function route(quiet) {
  stopTimers();
  if (info.auth_required && !sessionStorage.getItem(TOKEN_KEY)) { loginView(); return; }
  const hash = location.hash.replace(/^#/, "") || "/queues";
  const [path, query] = hash.split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  for (const a of document.querySelectorAll("header nav a")) {
    a.classList.toggle("active", a.dataset.nav === parts[0]);
  }
  try {
    if (!quiet) show(el("p", { class: "muted" }, "Loading…"));
    if (parts[0] === "queues" && parts[1]) await queueView(parts[1]);
    else if (parts[0] === "tasks" && parts[1]) await taskView(parts[1]);
    else if (parts[0] === "recent") await recentView(params);
    else if (parts[0] === "dead-letters") await deadLettersView(params);
    else if (parts[0] === "workers") await workersView();
    else if (parts[0] === "events") eventsView(params);
    else if (parts[0] === "audit") await auditView(params);
    // pages.js: history charts, schedules, rate limits
    else if (parts[0] === "history") await historyView(params);
    else if (parts[0] === "schedules") await schedulesView(params);
    else if (parts[0] === "rate-limits") await rateLimitsView(params);
    else if (window.dtqViews && window.dtqViews[parts[0]]) await window.dtqViews[parts[0]](params);
    else await queuesView(params);
  } catch (e) {
    if (e.status === 401) return;
    show(el("h1", {}, "Error"), el("p", { class: "error-text", id: "error" },
      e.message + (e.field ? " (field " + e.field + ")" : "")));
  }
}

async function boot() {
  try {
    info = await (await fetch("/api/info", { credentials: "omit" })).json();
  } catch (_) { /* keep defaults */ }
  const logout = document.getElementById("logout");
  if (info.auth_required && sessionStorage.getItem(TOKEN_KEY)) logout.classList.remove("hidden");
  logout.addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    logout.classList.add("hidden");
    route();
  });
  document.getElementById("goto-task").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const id = document.getElementById("goto-task-id").value.trim();
    if (id) location.hash = "#/tasks/" + encodeURIComponent(id);
  });
  window.addEventListener("hashchange", () => route());
  route();
}
document.addEventListener("DOMContentLoaded", boot);
