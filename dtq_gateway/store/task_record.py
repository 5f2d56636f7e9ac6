"""Convert a stored task record (``dtq:task:<id>`` hash) into ``dtq.v1.Task``.

The hash fields are documented in docs/design.md ("Task record"). Both the Admin
service (ListRecentTasks) and the Broker service (GetTask) build their replies
with :func:`task_from_hash`, so the mapping lives in exactly one place.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from dtq_gateway.store.replies import text as _text
from dtq_proto import dtq_pb2

log = logging.getLogger(__name__)

#: Hash ``status`` strings → TaskStatus enum values.
STATUS_BY_NAME: dict[str, dtq_pb2.TaskStatus] = {
    "queued": dtq_pb2.TASK_STATUS_QUEUED,
    "scheduled": dtq_pb2.TASK_STATUS_SCHEDULED,
    "active": dtq_pb2.TASK_STATUS_ACTIVE,
    "succeeded": dtq_pb2.TASK_STATUS_SUCCEEDED,
    "dead_lettered": dtq_pb2.TASK_STATUS_DEAD_LETTERED,
    "cancelled": dtq_pb2.TASK_STATUS_CANCELLED,
    "expired": dtq_pb2.TASK_STATUS_EXPIRED,
}
#: TaskStatus enum values → hash ``status`` strings.
NAME_BY_STATUS: dict[int, str] = {v: k for k, v in STATUS_BY_NAME.items()}

_ATT_RE = re.compile(r"^att:([0-9]{1,4})\Z")
_INT_FIELDS = ("created_at_ms", "not_before_ms", "expires_at_ms", "started_at_ms",
               "finished_at_ms", "updated_at_ms", "due_at_ms", "progress_at_ms")
#: Terminal statuses other than success: a chain stops at them.
_BROKEN = frozenset({"dead_lettered", "cancelled", "expired"})


def _int(value: bytes | str | None) -> int:
    try:
        return int(_text(value) or 0)
    except ValueError:
        return 0


def stringify(value: Any) -> str:
    """Map value of a JSON object → proto map string (JSON for non-strings)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _attempt(raw: Any, n: int) -> dtq_pb2.AttemptRecord | None:
    if not isinstance(raw, dict):
        return None
    return dtq_pb2.AttemptRecord(
        attempt=int(raw.get("attempt") or n),
        worker_id=_text(raw.get("worker_id")),
        started_at_ms=int(raw.get("started_at_ms") or 0),
        finished_at_ms=int(raw.get("finished_at_ms") or 0),
        outcome=_text(raw.get("outcome")),
        error_message=_text(raw.get("error_message")),
        error_class=_text(raw.get("error_class")),
    )


def _attempts(f: Mapping[str, bytes]) -> list[dtq_pb2.AttemptRecord]:
    """``prev_attempts`` (archived by RequeueDeadLetter) then ``att:<n>`` by n."""
    out: list[dtq_pb2.AttemptRecord] = []
    try:
        previous = json.loads(_text(f.get("prev_attempts")) or "[]")
    except ValueError:
        previous = []
    for raw in previous if isinstance(previous, list) else []:
        rec = _attempt(raw, 0)
        if rec is not None:
            out.append(rec)
    numbered = sorted((int(m.group(1)), k) for k in f if (m := _ATT_RE.match(k)))
    for n, k in numbered:
        try:
            rec = _attempt(json.loads(_text(f[k])), n)
        except ValueError:
            rec = None
        if rec is not None:
            rec.attempt = n
            out.append(rec)
    current = _int(f.get("attempt"))
    if _text(f.get("status")) == "active" and current not in {n for n, _ in numbered}:
        # the running attempt is recorded as att:<n> only when it ends (activate.lua
        # writes just status, worker_id and started_at_ms)
        out.append(dtq_pb2.AttemptRecord(
            attempt=current, worker_id=_text(f.get("worker_id")),
            started_at_ms=_int(f.get("started_at_ms")), outcome="running"))
    return out


def _metadata(f: Mapping[str, bytes]) -> dict[str, str]:
    try:
        raw = json.loads(_text(f.get("metadata")) or "{}")
    except ValueError:
        raw = {}
    meta = {str(k): stringify(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
    if _text(f.get("discarded")) == "1":
        meta["discarded"] = "true"
    requeues = _int(f.get("requeues"))
    if requeues:
        meta["requeues"] = str(requeues)
    return meta


def _follow_ups(task: dtq_pb2.Task, f: Mapping[str, bytes]) -> None:
    """Progress, chain, group and trace fields (see followups.py for the record fields)."""
    try:
        task.progress_percent = float(_text(f.get("progress")) or 0)
    except ValueError:
        task.progress_percent = 0.0
    task.progress_message = _text(f.get("progress_message"))
    task.chain_id = _text(f.get("chain_id"))
    task.chain_step = _int(f.get("chain_step"))
    task.next_task_id = _text(f.get("next_task_id"))
    task.group_id = _text(f.get("group_id"))
    task.traceparent = task.metadata.get("traceparent", "")
    if f.get("chain_next"):
        status = _text(f.get("status"))
        if status == "succeeded":
            task.chain_state = (dtq_pb2.CHAIN_STATE_CONTINUED if task.next_task_id
                                else dtq_pb2.CHAIN_STATE_CONTINUING)
        elif status in _BROKEN:
            task.chain_state = dtq_pb2.CHAIN_STATE_BROKEN
        else:
            task.chain_state = dtq_pb2.CHAIN_STATE_WAITING


def normalize(fields: Mapping[Any, bytes | str]) -> dict[str, bytes]:
    """Hash reply with str keys and bytes values (accepts either encoding)."""
    out: dict[str, bytes] = {}
    for k, v in fields.items():
        out[_text(k)] = v if isinstance(v, bytes) else str(v).encode()
    return out


def task_from_hash(fields: Mapping[Any, bytes | str], result: bytes | None = None,
                   *, include_payload: bool = True) -> dtq_pb2.Task:
    """Build a ``dtq.v1.Task`` from an HGETALL reply of ``dtq:task:<id>``.

    Args:
        fields: the hash (keys and values as bytes or str).
        result: the ``dtq:result:<id>`` value, or None when absent or expired.
        include_payload: False leaves ``payload`` empty (listings).

    Returns:
        The task message. Unknown status strings map to TASK_STATUS_UNSPECIFIED.
    """
    f = normalize(fields)
    task = dtq_pb2.Task(
        task_id=_text(f.get("task_id")), queue=_text(f.get("queue")),
        task_type=_text(f.get("task_type")),
        payload=f.get("payload", b"") if include_payload else b"",
        content_type=_text(f.get("content_type")), priority=_int(f.get("priority")),
        status=STATUS_BY_NAME.get(_text(f.get("status")), dtq_pb2.TASK_STATUS_UNSPECIFIED),
        attempt=_int(f.get("attempt")), max_attempts=_int(f.get("max_attempts")),
        timeout_ms=_int(f.get("timeout_ms")), idempotency_key=_text(f.get("idem_key")),
        worker_id=_text(f.get("worker_id")), last_error=_text(f.get("last_error")),
        last_error_class=_text(f.get("last_error_class")),
        result=result or b"", result_truncated=_text(f.get("result_truncated")) == "1",
        cancel_requested=_text(f.get("cancel_requested")) == "1",
        retry_policy=dtq_pb2.RetryPolicy(backoff_base_ms=_int(f.get("backoff_base_ms")),
                                         backoff_cap_ms=_int(f.get("backoff_cap_ms"))),
    )
    for name in _INT_FIELDS:
        setattr(task, name, _int(f.get(name)))
    task.metadata.update(_metadata(f))
    _follow_ups(task, f)
    task.attempts.extend(_attempts(f))
    return task
