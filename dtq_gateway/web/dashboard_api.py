"""The dashboard's JSON API: the same gateway internals the Admin servicer calls.

Each function here takes a :class:`Backend` (the gateway's Redis client, settings,
broker, events hub, dispatcher and rate tracker) plus validated arguments, and
returns a JSON-ready dict. Errors are the domain errors of :mod:`dtq_gateway.errors`
(InvalidArgument names the field); :mod:`dtq_gateway.web.dashboard` maps them to HTTP
statuses the way :mod:`dtq_gateway.rpc.grpc_errors` maps them to gRPC codes.

Payloads and results are decoded for people: JSON when they parse as JSON, else
UTF-8 text, else base64 (``payload.encoding`` says which).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from dtq_gateway import task_filters
from dtq_gateway.domain.validation import MAX_REASON_BYTES, cut_utf8
from dtq_gateway.errors import InvalidArgument, NotFound
from dtq_gateway.settings import Settings
from dtq_gateway.store import admin, admin_dlq, admin_lists, bulk, keys, search
from dtq_gateway.store.admin import CallInfo, as_int
from dtq_gateway.store.broker import Broker
from dtq_gateway.store.client import Client
from dtq_gateway.store.replies import text
from dtq_gateway.store.task_record import STATUS_BY_NAME, task_from_hash
from dtq_gateway.web.dashboard_rates import RateTracker
from dtq_proto import dtq_pb2 as pb

#: Most queues on one page of the queues view.
QUEUES_PAGE_MAX = 500
MAX_REDRIVE_LIMIT = 100_000
MAX_REDRIVE_RATE = 10_000
#: Most payload bytes of one dead letter in a listing (the task page shows all).
LIST_PAYLOAD_BYTES = 1024


@dataclass
class Backend:
    """What the dashboard reads and acts through (the gateway's own objects)."""

    redis: Client
    settings: Settings
    broker: Broker
    rates: RateTracker
    #: open Lease sessions of this replica by session id (Dispatcher.sessions)
    sessions: dict[str, Any]

    @property
    def dlq(self) -> admin_dlq.DlqSettings:
        """Settings of the dead-letter operations."""
        s = self.settings
        return admin_dlq.DlqSettings(audit_maxlen=s.audit_maxlen,
                                     task_retention_s=s.task_retention_s,
                                     idem_ttl_s=s.idem_ttl_s)


def decode_bytes(data: bytes, content_type: str = "", max_bytes: int = 0) -> dict[str, Any]:
    """Bytes for display: ``{"encoding": "json"|"text"|"base64"|"empty", "value": ...,
    "bytes": n}``. JSON is tried for JSON content types and for untyped data.

    With ``max_bytes`` > 0, data longer than that is cut to its first ``max_bytes``
    bytes, shown as text (invalid UTF-8 replaced) and marked ``"truncated": true``:
    listings stay small whatever the payloads weigh.
    """
    out: dict[str, Any] = {"bytes": len(data)}
    if not data:
        return {**out, "encoding": "empty", "value": ""}
    if 0 < max_bytes < len(data):
        return {**out, "encoding": "text", "truncated": True,
                "value": data[:max_bytes].decode("utf-8", errors="replace")}
    ct = content_type.split(";", 1)[0].strip().lower()
    if ct in ("", "application/json") or ct.endswith("+json"):
        try:
            return {**out, "encoding": "json", "value": json.loads(data)}
        except (ValueError, RecursionError):  # nested deeper than this stack: shown as text
            pass
    try:
        return {**out, "encoding": "text", "value": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {**out, "encoding": "base64", "value": base64.b64encode(data).decode()}


def status_name(status: int) -> str:
    """A TaskStatus as the JSON API writes it: the enum name without its prefix, in
    upper case (``SUCCEEDED``, ``DEAD_LETTERED``), as ``dtq --json`` and the Python
    client's ``TaskStatus`` name it; ``UNSPECIFIED`` for a value not known."""
    try:
        return pb.TaskStatus.Name(status).removeprefix("TASK_STATUS_")
    except ValueError:
        return "UNSPECIFIED"


def task_json(task: pb.Task, *, with_payload: bool = True) -> dict[str, Any]:
    """A ``dtq.v1.Task`` as the dashboard shows it (times in epoch ms; ``status`` and
    ``chain_state`` as upper-case enum names without their prefix)."""
    out: dict[str, Any] = {
        "task_id": task.task_id, "queue": task.queue, "task_type": task.task_type,
        "status": status_name(task.status), "priority": task.priority,
        "attempt": task.attempt, "max_attempts": task.max_attempts,
        "timeout_ms": task.timeout_ms, "idempotency_key": task.idempotency_key,
        "worker_id": task.worker_id, "last_error": task.last_error,
        "last_error_class": task.last_error_class, "content_type": task.content_type,
        "created_at_ms": task.created_at_ms, "not_before_ms": task.not_before_ms,
        "expires_at_ms": task.expires_at_ms, "started_at_ms": task.started_at_ms,
        "finished_at_ms": task.finished_at_ms, "updated_at_ms": task.updated_at_ms,
        "cancel_requested": task.cancel_requested, "metadata": dict(task.metadata),
        "attempts": [{"attempt": a.attempt, "worker_id": a.worker_id,
                      "started_at_ms": a.started_at_ms, "finished_at_ms": a.finished_at_ms,
                      "outcome": a.outcome, "error_message": a.error_message,
                      "error_class": a.error_class} for a in task.attempts],
        # progress reported by the handler (percent 0..100; 0 / "" when none)
        "progress_percent": task.progress_percent, "progress_message": task.progress_message,
        "progress_at_ms": task.progress_at_ms,
        "chain_id": task.chain_id, "chain_step": task.chain_step,
        "next_task_id": task.next_task_id, "group_id": task.group_id,
        "chain_state": pb.ChainState.Name(task.chain_state).removeprefix("CHAIN_STATE_"),
    }
    if with_payload:
        out["payload"] = decode_bytes(task.payload, task.content_type)
        out["result"] = decode_bytes(task.result)
        out["result_truncated"] = task.result_truncated
    return out


def check_task_id(task_id: str) -> str:
    """Raise InvalidArgument (field ``task_id``) unless 32 lowercase hex characters."""
    if not keys.TASK_ID_RE.match(task_id or ""):
        raise InvalidArgument("task_id: must be 32 lowercase hex characters", field="task_id")
    return task_id


def int_arg(raw: Any, name: str, default: int, lo: int, hi: int) -> int:
    """An integer argument (query string or JSON) in ``lo..hi``; missing/"" = default.

    Raises:
        InvalidArgument: not an integer, or out of range (names ``name``).
    """
    if raw is None or raw == "":
        return default
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise InvalidArgument(f"{name}: must be an integer", field=name)
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(f"{name}: must be an integer", field=name) from None
    if not lo <= value <= hi:
        raise InvalidArgument(f"{name}: must be {lo}..{hi}", field=name)
    return value


def str_arg(raw: Any, name: str, max_len: int = 1024) -> str:
    """A string argument ("" when missing).

    Raises:
        InvalidArgument: not a string or longer than ``max_len`` characters.
    """
    if raw is None:
        return ""
    if not isinstance(raw, str) or len(raw) > max_len:
        raise InvalidArgument(f"{name}: must be a string of at most {max_len} characters",
                              field=name)
    return raw


def bool_arg(raw: Any, name: str) -> bool:
    """A JSON boolean argument (missing = False)."""
    if raw is None:
        return False
    if not isinstance(raw, bool):
        raise InvalidArgument(f"{name}: must be true or false", field=name)
    return raw


def _band_json(bands: list[admin.BandInfo]) -> list[dict[str, int]]:
    return [{"band": b.band, "depth": b.depth, "pending": b.pending} for b in bands]


async def queues(b: Backend, page_size: int, page_token: str) -> dict[str, Any]:
    """One page of queues with per-band depth, backlog age and throughput."""
    summaries, token = await admin.list_queues(b.redis, page_size, page_token)
    names = [q.name for q in summaries]
    bands = await admin.band_infos_many(b.redis, names) if names else {}
    now = await admin.redis_now_ms(b.redis)
    rows = []
    for q in summaries:
        oldest = [x.oldest_undelivered_ms for x in bands.get(q.name, []) if
                  x.oldest_undelivered_ms]
        rows.append({"name": q.name, "depth": q.depth, "pending": q.pending,
                     "paused": q.paused, "bands": _band_json(bands.get(q.name, [])),
                     "backlog_age_ms": max(0, now - min(oldest)) if oldest else 0,
                     "rates": b.rates.rates(q.name).as_dict()})
    return {"queues": rows, "next_page_token": token}


async def queue(b: Backend, name: str) -> dict[str, Any]:
    """GetQueueStats of one queue plus throughput and its most recent tasks."""
    stats = await admin.queue_stats(b.redis, name)
    recent = await admin_lists.list_recent_tasks(b.redis, 20, name)
    return {"queue": stats.queue, "depth": stats.depth, "pending": stats.pending,
            "scheduled": stats.scheduled, "backlog_age_ms": stats.oldest_task_age_ms,
            "paused": stats.paused, "dead_letter_depth": stats.dead_letter_depth,
            "bands": _band_json(stats.bands),
            "consumers": [{"name": c.name, "pending": c.pending, "idle_ms": c.idle_ms}
                          for c in stats.consumers],
            "rates": b.rates.rates(name).as_dict(),
            # outcome counts since the queue was created (dtq:queue:<q>:counters)
            "succeeded": stats.counters.get("succeeded", 0), "failed": stats.failed,
            "retried": stats.counters.get("retried", 0),
            "dead_lettered": stats.counters.get("dead_lettered", 0),
            "cancelled": stats.counters.get("cancelled", 0),
            # waiting tasks by type; "stuck" = a type no live worker of the queue takes
            "waiting_types": [{"task_type": t.task_type, "waiting": t.waiting,
                               "oldest_age_ms": t.oldest_age_ms, "taken": t.taken}
                              for t in stats.waiting_types],
            "waiting_complete": stats.waiting_complete,
            "stuck_task_types": stats.stuck_task_types,
            "recent": [task_json(task_from_hash(f, None, include_payload=False),
                                 with_payload=False) for f in recent]}


async def set_paused(b: Backend, name: str, paused: bool, reason: str, call: CallInfo
                     ) -> dict[str, Any]:
    """Pause or resume a queue (audited)."""
    admin.validate_queue(name)
    changed = await admin.set_paused(b.redis, name, paused, call,
                                     cut_utf8(reason, MAX_REASON_BYTES),
                                     audit_maxlen=b.settings.audit_maxlen)
    return {"queue": name, "paused": paused, "changed": changed,
            "request_id": call.request_id}


async def task(b: Backend, task_id: str) -> dict[str, Any]:
    """One task with decoded payload and result, attempt history and errors."""
    check_task_id(task_id)
    fields, result = await b.broker.get(task_id)
    return task_json(task_from_hash(fields, result))


async def cancel(b: Backend, task_id: str, reason: str, call: CallInfo) -> dict[str, Any]:
    """Cancel a task (audited): "cancelled", or "requested" for an active one."""
    check_task_id(task_id)
    kind = await b.broker.cancel(task_id, call.actor, call.request_id,
                                 cut_utf8(reason, MAX_REASON_BYTES))
    return {"task_id": task_id, "outcome": kind, "request_id": call.request_id}


async def recent(b: Backend, limit: int, queue_name: str, status: str) -> dict[str, Any]:
    """Most recently created tasks, newest first, payload omitted; ``status`` filters by
    a status name in either case (``DEAD_LETTERED`` or ``dead_lettered``)."""
    if queue_name:
        admin.validate_queue(queue_name)
    status = status.lower()
    if status and status not in STATUS_BY_NAME:
        raise InvalidArgument("status: one of " + ", ".join(n.upper() for n in STATUS_BY_NAME),
                              field="status")
    rows = await admin_lists.list_recent_tasks(b.redis, limit, queue_name, status)
    return {"tasks": [task_json(task_from_hash(f, None, include_payload=False),
                                with_payload=False) for f in rows]}


def _dead_letter_json(e: admin_dlq.DeadLetterEntry) -> dict[str, Any]:
    f = e.fields
    return {"entry_id": e.entry_id, "task_id": text(f.get("task_id")),
            "queue": text(f.get("original_queue") or f.get("queue")),
            "task_type": text(f.get("task_type")),
            "payload": decode_bytes(f.get("payload", b""), text(f.get("content_type")),
                                    max_bytes=LIST_PAYLOAD_BYTES),
            "attempts_made": as_int(f.get("attempts_made")),
            "last_error": text(f.get("last_error")),
            "last_error_class": text(f.get("last_error_class")),
            "failed_at_ms": as_int(f.get("failed_at_ms")), "worker_id": text(f.get("worker_id")),
            "priority": as_int(f.get("priority"))}


async def dead_letters(b: Backend, size: int, token: str, queue_name: str, task_type: str,
                       error_class: str) -> dict[str, Any]:
    """One page of dead letters, newest first. ``task_type`` and ``error_class`` filter
    within the page (so a page may hold fewer than ``size`` entries and still carry a
    next page token); ``queue_name`` filters in the scan, as ListDeadLetters does."""
    entries, next_token = await admin_dlq.list_dead_letters(b.redis, size, token, queue_name)
    rows = [_dead_letter_json(e) for e in entries]
    rows = [r for r in rows if (not task_type or r["task_type"] == task_type)
            and (not error_class or r["last_error_class"] == error_class)]
    return {"entries": rows, "next_page_token": next_token}


async def requeue(b: Backend, task_id: str, call: CallInfo) -> dict[str, Any]:
    """RequeueDeadLetter."""
    await admin_dlq.requeue(b.redis, check_task_id(task_id), call, b.dlq)
    return {"task_id": task_id, "request_id": call.request_id}


async def discard(b: Backend, task_id: str, call: CallInfo) -> dict[str, Any]:
    """DiscardDeadLetter."""
    await admin_dlq.discard(b.redis, check_task_id(task_id), call, b.dlq)
    return {"task_id": task_id, "request_id": call.request_id}


def redrive_filter(body: dict[str, Any]) -> admin_dlq.RedriveFilter:
    """The RedriveDeadLetters filter from a JSON body (same rules as the RPC)."""
    queue_name = str_arg(body.get("queue"), "queue", 64)
    if queue_name:
        admin.validate_queue(queue_name)
    task_type = str_arg(body.get("task_type"), "task_type", 128)
    if task_type and not keys.TASK_TYPE_RE.match(task_type):
        raise InvalidArgument("task_type: must match [A-Za-z0-9_.:/-]{1,128}", field="task_type")
    error_class = str_arg(body.get("error_class"), "error_class", 128)
    day = 365 * 86_400_000
    min_age = int_arg(body.get("min_age_ms"), "min_age_ms", 0, 0, day)
    max_age = int_arg(body.get("max_age_ms"), "max_age_ms", 0, 0, day)
    if max_age and min_age > max_age:
        raise InvalidArgument("max_age_ms: must be >= min_age_ms", field="max_age_ms")
    return admin_dlq.RedriveFilter(queue=queue_name, task_type=task_type,
                                   error_class=error_class, min_age_ms=min_age,
                                   max_age_ms=max_age)


async def redrive(b: Backend, body: dict[str, Any], call: CallInfo) -> dict[str, Any]:
    """RedriveDeadLetters: requeue (or count, with ``dry_run``) matching dead letters."""
    flt = redrive_filter(body)
    dry_run = bool_arg(body.get("dry_run"), "dry_run")
    limit = int_arg(body.get("limit"), "limit", 1000, 1, MAX_REDRIVE_LIMIT)
    rate = int_arg(body.get("max_per_second"), "max_per_second", 100, 1, MAX_REDRIVE_RATE)
    result = await admin_dlq.redrive(b.redis, flt, call, b.dlq, dry_run=dry_run,
                                     max_per_second=rate, limit=limit)
    return {"matched": result.matched, "requeued": result.requeued, "dry_run": dry_run,
            "task_ids": result.task_ids, "request_id": call.request_id}


def _json_field(raw: bytes | None) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


async def workers(b: Backend) -> dict[str, Any]:
    """Known workers: state, heartbeat age, in-flight, counters, and the queues and
    labels of their Lease sessions (from the worker record when it has them, else
    from the sessions open on this replica)."""
    records = await admin_lists.list_workers(b.redis, b.settings.heartbeat_interval_ms)
    extra = await admin_lists.worker_session_fields(b.redis, [w.worker_id for w in records])
    local: dict[str, tuple[set[str], dict[str, str]]] = {}
    for s in list(b.sessions.values()):
        qs, labels = local.setdefault(s.worker_id, (set(), {}))
        qs.update(s.queues)
        labels.update(getattr(s, "labels", None) or {})
    rows = []
    for w, (raw_queues, raw_labels) in zip(records, extra):
        qs, labels = local.get(w.worker_id, (set(), {}))
        stored_q, stored_l = _json_field(raw_queues), _json_field(raw_labels)
        if isinstance(stored_q, list):
            qs = qs | {str(q) for q in stored_q}
        if isinstance(stored_l, dict):
            labels = {**{str(k): str(v) for k, v in stored_l.items()}, **labels}
        rows.append({"worker_id": w.worker_id, "hostname": w.hostname, "status": w.status,
                     "alive": w.alive, "leasing": w.leasing,
                     "heartbeat_age_ms": w.heartbeat_age_ms, "started_at_ms": w.started_at_ms,
                     "in_flight": w.active_tasks, "concurrency": w.concurrency,
                     "tasks_processed": w.tasks_processed, "tasks_failed": w.tasks_failed,
                     "tasks_retried": w.tasks_retried, "queues": sorted(qs),
                     "labels": dict(sorted(labels.items()))})
    return {"workers": rows}


async def audit(b: Backend, size: int, token: str) -> dict[str, Any]:
    """One page of the audit stream, newest first."""
    items, next_token = await admin_lists.list_audit(b.redis, size, token)
    return {"entries": [{"entry_id": a.entry_id, "actor": a.actor, "action": a.action,
                         "task_id": a.task_id, "ts_ms": a.ts_ms, "request_id": a.request_id,
                         "detail": a.detail} for a in items], "next_page_token": next_token}


# -- bulk cancels and search (CancelTasks, PurgeQueue, SearchTasks) ------------------------
def task_filter(raw: Any) -> pb.TaskFilter:
    """A ``TaskFilter`` from JSON: ``{"queue", "task_type", "statuses": ["QUEUED", ...],
    "metadata": {k: v}, "min_age_ms", "max_age_ms", "created_after_ms",
    "created_before_ms"}`` (every field optional here; the callers' rules follow).

    Raises:
        InvalidArgument: a field of the wrong type or range (named ``filter.<field>``).
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise InvalidArgument("filter: must be an object", field="filter")
    statuses = raw.get("statuses") or []
    if not isinstance(statuses, list):
        raise InvalidArgument("filter.statuses: must be a list", field="filter.statuses")
    values: list[pb.TaskStatus] = []
    for name in statuses:
        key = str(name).lower()
        if not isinstance(name, str) or key not in STATUS_BY_NAME:
            raise InvalidArgument("filter.statuses: one of " + ", ".join(
                n.upper() for n in STATUS_BY_NAME), field="filter.statuses")
        values.append(STATUS_BY_NAME[key])
    meta = raw.get("metadata") or {}
    if not isinstance(meta, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise InvalidArgument("filter.metadata: must be an object of strings",
                              field="filter.metadata")
    day = 365 * 86_400_000
    ints = {name: int_arg(raw.get(name), "filter." + name, 0, 0, day)
            for name in ("min_age_ms", "max_age_ms")}
    for name in ("created_after_ms", "created_before_ms"):
        ints[name] = int_arg(raw.get(name), "filter." + name, 0, 0, 1 << 62)
    return pb.TaskFilter(queue=str_arg(raw.get("queue"), "filter.queue", 64),
                         task_type=str_arg(raw.get("task_type"), "filter.task_type", 128),
                         statuses=values, metadata=meta, **ints)


async def _bulk(b: Backend, flt: bulk.TaskFilter, call: CallInfo, action: str, dry_run: bool,
                limit: int, reason: str) -> dict[str, Any]:
    if not await admin.queue_known(b.redis, flt.queue):
        raise NotFound(f"queue: no queue named {flt.queue!r}", reason="QUEUE_NOT_FOUND")
    s = b.settings
    out = await bulk.bulk_cancel(b.redis, flt, call, action=action, dry_run=dry_run,
                                 limit=limit, reason=cut_utf8(reason, MAX_REASON_BYTES),
                                 task_retention_s=s.task_retention_s,
                                 keep_finished=s.keep_finished_for(flt.queue),
                                 audit_maxlen=s.audit_maxlen)
    return {"matched": out.matched, "cancelled": out.cancelled,
            "cancel_requested": out.requested, "dry_run": dry_run,
            "task_ids": out.task_ids, "request_id": call.request_id}


async def cancel_matching(b: Backend, body: dict[str, Any], call: CallInfo) -> dict[str, Any]:
    """CancelTasks: cancel (or count, with ``dry_run``) the waiting tasks of
    ``filter.queue`` matching ``filter`` (audited as cancel_tasks)."""
    flt = task_filters.cancel_filter(task_filter(body.get("filter")))
    limit = int_arg(body.get("limit"), "limit", 100_000, 1, task_filters.MAX_CANCEL_LIMIT)
    return await _bulk(b, flt, call, "cancel_tasks", bool_arg(body.get("dry_run"), "dry_run"),
                       limit, str_arg(body.get("reason"), "reason"))


async def purge_queue(b: Backend, name: str, body: dict[str, Any], call: CallInfo
                      ) -> dict[str, Any]:
    """PurgeQueue: cancel (or count, with ``dry_run``) every waiting task of ``name``
    (audited as purge_queue)."""
    admin.validate_queue(name)
    return await _bulk(b, bulk.TaskFilter(queue=name), call, "purge_queue",
                       bool_arg(body.get("dry_run"), "dry_run"),
                       task_filters.MAX_CANCEL_LIMIT, str_arg(body.get("reason"), "reason"))


async def search_tasks(b: Backend, raw_filter: Any, size: int, token: str) -> dict[str, Any]:
    """SearchTasks: one page of matching tasks of the recent-tasks index, newest first."""
    flt = await task_filters.search_filter(b.redis, task_filter(raw_filter))
    rows, next_token, examined = await search.search(b.redis, flt, size, token)
    return {"tasks": [task_json(task_from_hash(f, None, include_payload=False),
                                with_payload=False) for f in rows],
            "next_page_token": next_token, "examined": examined}
