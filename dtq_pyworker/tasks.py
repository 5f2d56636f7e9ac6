"""Typed views of what the gateway answers a producer: :class:`Task`, its status,
its attempts, and the exceptions :meth:`Client.wait` raises for a task that ended
without succeeding.

The protobuf messages stay reachable: every view keeps its message in ``raw``,
and an attribute the view does not define is read from it (``task.created_at_ms``,
``task.due_at_ms``), so code written against the protobuf records keeps working.
Times are timezone-aware UTC datetimes (None where the record says 0 = unset);
payloads and results are decoded from JSON where they are JSON.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dtq_proto import dtq_pb2
from dtq_pyworker.codec import decode_payload, is_json


class TaskStatus(enum.IntEnum):
    """Lifecycle state of a task; values equal ``dtq_pb2.TaskStatus``, so a
    member compares equal to the protobuf constant (``TaskStatus.SUCCEEDED ==
    dtq_pb2.TASK_STATUS_SUCCEEDED``)."""

    UNSPECIFIED = dtq_pb2.TASK_STATUS_UNSPECIFIED
    QUEUED = dtq_pb2.TASK_STATUS_QUEUED
    SCHEDULED = dtq_pb2.TASK_STATUS_SCHEDULED
    ACTIVE = dtq_pb2.TASK_STATUS_ACTIVE
    SUCCEEDED = dtq_pb2.TASK_STATUS_SUCCEEDED
    DEAD_LETTERED = dtq_pb2.TASK_STATUS_DEAD_LETTERED
    CANCELLED = dtq_pb2.TASK_STATUS_CANCELLED
    EXPIRED = dtq_pb2.TASK_STATUS_EXPIRED

    @classmethod
    def of(cls, value: int) -> TaskStatus:
        """The member for a protobuf value (UNSPECIFIED for a value this client
        does not know, e.g. from a newer gateway)."""
        try:
            return cls(value)
        except ValueError:
            return cls.UNSPECIFIED

    @property
    def terminal(self) -> bool:
        """True for SUCCEEDED, DEAD_LETTERED, CANCELLED and EXPIRED."""
        return self in _TERMINAL


class ChainState(enum.IntEnum):
    """Where a chain stands at a task; values equal ``dtq_pb2.ChainState``
    (``ChainState.BROKEN == dtq_pb2.CHAIN_STATE_BROKEN``).

    UNSPECIFIED: no later steps (or not in a chain); WAITING: the task has not finished;
    CONTINUING: it succeeded and the next step is being created; CONTINUED: the next
    step exists (``next_task_id``); BROKEN: it ended without success and the later steps
    are never created.
    """

    UNSPECIFIED = dtq_pb2.CHAIN_STATE_UNSPECIFIED
    WAITING = dtq_pb2.CHAIN_STATE_WAITING
    CONTINUING = dtq_pb2.CHAIN_STATE_CONTINUING
    CONTINUED = dtq_pb2.CHAIN_STATE_CONTINUED
    BROKEN = dtq_pb2.CHAIN_STATE_BROKEN

    @classmethod
    def of(cls, value: int) -> ChainState:
        """The member for a protobuf value (UNSPECIFIED for one this client does not
        know)."""
        try:
            return cls(value)
        except ValueError:
            return cls.UNSPECIFIED


_TERMINAL = frozenset({TaskStatus.SUCCEEDED, TaskStatus.DEAD_LETTERED, TaskStatus.CANCELLED,
                       TaskStatus.EXPIRED})


def from_epoch_ms(ms: int) -> datetime | None:
    """A UTC-aware datetime for epoch milliseconds; None for 0 (unset)."""
    if not ms:
        return None
    return datetime.fromtimestamp(ms / 1000.0, tz=UTC)


def decode_result(data: bytes, truncated: bool = False) -> Any:
    """Decode a stored result: the JSON value when the bytes are complete UTF-8
    JSON (what the reference workers store for anything but bytes), None when
    empty, else the bytes themselves (a truncated result is never parsed)."""
    if not data:
        return None
    if truncated:
        return bytes(data)
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return bytes(data)


def decode_task_payload(data: bytes, content_type: str) -> Any:
    """The payload decoded as a handler would see it (JSON value for JSON media
    types, None when empty), or the bytes when it is not JSON or not valid JSON."""
    try:
        return decode_payload(data, content_type)
    except (UnicodeDecodeError, ValueError):
        return bytes(data)


class _RawFallback:
    """Attributes the view lacks are read from the protobuf message in ``raw``."""

    raw: Any

    def __getattr__(self, name: str) -> Any:
        if name == "raw" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.raw, name)


@dataclass(frozen=True)
class Attempt(_RawFallback):
    """One execution attempt of a task.

    Attributes:
        attempt: Attempt number, 1-based.
        worker_id: Worker that ran it.
        started_at: Lease start (UTC).
        finished_at: End (UTC), None while running.
        outcome: "running", "succeeded", "failed", "released", "cancelled" or
            "lease_expired".
        error_message: Error text of a failed attempt ("" if none).
        error_class: Error class of a failed attempt ("" if none).
        raw: The ``dtq_pb2.AttemptRecord``.
    """

    attempt: int
    worker_id: str
    started_at: datetime | None
    finished_at: datetime | None
    outcome: str
    error_message: str
    error_class: str
    raw: dtq_pb2.AttemptRecord = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, rec: dtq_pb2.AttemptRecord) -> Attempt:
        """Build from an AttemptRecord."""
        return cls(rec.attempt, rec.worker_id, from_epoch_ms(rec.started_at_ms),
                   from_epoch_ms(rec.finished_at_ms), rec.outcome, rec.error_message,
                   rec.error_class, rec)


@dataclass(frozen=True)
class Task(_RawFallback):
    """A task record as a producer sees it.

    Attributes:
        task_id: 32 hex characters.
        queue: Queue name.
        task_type: Handler name.
        status: :class:`TaskStatus`.
        payload: Decoded payload: the JSON value for JSON media types, else bytes
            (``payload_bytes`` has the bytes as enqueued).
        content_type: Media type of the payload.
        result: Decoded result: the JSON value when the stored result is JSON,
            None when there is none, else bytes (``result_bytes`` has the bytes).
        result_truncated: True when the stored result was cut to
            DTQ_RESULT_MAX_BYTES (``result`` is then the raw bytes).
        priority: Band 0..9.
        attempt: Attempt number of the current or next execution, 1-based.
        max_attempts: Attempts allowed in total.
        timeout_ms: Handler time limit (ms).
        attempts: Every attempt so far, oldest first.
        error: Last error message ("" if none).
        error_class: Last error class ("" if none).
        worker_id: Worker of the current or last attempt.
        idempotency_key: Idempotency key ("" if none).
        metadata: Metadata given at enqueue, plus gateway notes.
        cancel_requested: True when CancelTask flagged the running task.
        created_at, updated_at, started_at, finished_at, not_before, expires_at,
        due_at: UTC datetimes, None where unset.
        progress_percent, progress_message, progress_at: The handler's latest progress
            report (0..100, text, UTC time; 0.0, "" and None before the first one).
        chain_id, chain_step, next_task_id: Chain membership ("" / 0 outside a chain;
            next_task_id is set once the next step was enqueued).
        chain_state: A :class:`ChainState` (UNSPECIFIED outside a chain or at its last
            step).
        group_id: The task group ("" outside a group).
        raw: The ``dtq_pb2.Task``; any attribute not listed here (such as
            ``created_at_ms``) is read from it.
    """

    task_id: str
    queue: str
    task_type: str
    status: TaskStatus
    payload: Any
    content_type: str
    result: Any
    result_truncated: bool
    priority: int
    attempt: int
    max_attempts: int
    timeout_ms: int
    attempts: tuple[Attempt, ...]
    error: str
    error_class: str
    worker_id: str
    idempotency_key: str
    metadata: dict[str, str]
    cancel_requested: bool
    created_at: datetime | None
    updated_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    not_before: datetime | None
    expires_at: datetime | None
    due_at: datetime | None
    progress_percent: float
    progress_message: str
    progress_at: datetime | None
    chain_id: str
    chain_step: int
    next_task_id: str
    chain_state: ChainState
    group_id: str
    raw: dtq_pb2.Task = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, t: dtq_pb2.Task) -> Task:
        """Build from a ``dtq_pb2.Task`` (payload and result decoded, times as UTC)."""
        return cls(
            task_id=t.task_id, queue=t.queue, task_type=t.task_type,
            status=TaskStatus.of(t.status),
            payload=decode_task_payload(t.payload, t.content_type),
            content_type=t.content_type,
            result=decode_result(t.result, t.result_truncated),
            result_truncated=t.result_truncated, priority=t.priority, attempt=t.attempt,
            max_attempts=t.max_attempts, timeout_ms=t.timeout_ms,
            attempts=tuple(Attempt.from_proto(a) for a in t.attempts),
            error=t.last_error, error_class=t.last_error_class, worker_id=t.worker_id,
            idempotency_key=t.idempotency_key, metadata=dict(t.metadata),
            cancel_requested=t.cancel_requested,
            created_at=from_epoch_ms(t.created_at_ms), updated_at=from_epoch_ms(t.updated_at_ms),
            started_at=from_epoch_ms(t.started_at_ms),
            finished_at=from_epoch_ms(t.finished_at_ms),
            not_before=from_epoch_ms(t.not_before_ms), expires_at=from_epoch_ms(t.expires_at_ms),
            due_at=from_epoch_ms(t.due_at_ms), progress_percent=t.progress_percent,
            progress_message=t.progress_message, progress_at=from_epoch_ms(t.progress_at_ms),
            chain_id=t.chain_id, chain_step=t.chain_step, next_task_id=t.next_task_id,
            chain_state=ChainState.of(t.chain_state), group_id=t.group_id, raw=t)

    @property
    def payload_bytes(self) -> bytes:
        """The payload exactly as enqueued."""
        return self.raw.payload

    @property
    def result_bytes(self) -> bytes:
        """The stored result bytes (b"" when none)."""
        return self.raw.result

    @property
    def payload_is_json(self) -> bool:
        """True when the payload's media type is JSON."""
        return is_json(self.content_type)

    @property
    def terminal(self) -> bool:
        """True once the task reached a terminal state."""
        return self.status.terminal


@dataclass(frozen=True)
class CancelResult:
    """What CancelTask did.

    Attributes:
        status: CANCELLED, or ACTIVE when the running task was only flagged (its
            worker learns it at its next heartbeat).
        cancel_requested: True when the task was running and got flagged.
        request_id: Request id recorded in the audit stream.
    """

    status: TaskStatus
    cancel_requested: bool
    request_id: str


class TaskNotSucceeded(Exception):
    """Base of the exceptions :meth:`Client.wait` raises for a task that ended
    without succeeding.

    Attributes:
        task: The terminal :class:`Task`.
        task_id: Its id.
        status: Its :class:`TaskStatus`.
        error: Last error message ("" when none, e.g. for a cancellation).
        error_class: Last error class ("" when none).
    """

    def __init__(self, task: Task) -> None:
        detail = f": {task.error_class or 'error'}: {task.error}" if task.error else ""
        super().__init__(f"task {task.task_id} {task.status.name.lower()}{detail}")
        self.task = task
        self.task_id = task.task_id
        self.status = task.status
        self.error = task.error
        self.error_class = task.error_class


class TaskFailed(TaskNotSucceeded):
    """The task was dead-lettered: out of attempts or failed permanently."""


class TaskCancelled(TaskNotSucceeded):
    """The task was cancelled."""


class TaskExpired(TaskNotSucceeded):
    """The task passed its expiry before any worker started it."""


class TaskWaitTimeout(TimeoutError):
    """The task did not end within the wait's timeout (a :class:`TimeoutError`).

    Attributes:
        task: The task as last read (not terminal), or None if it did not exist yet.
    """

    def __init__(self, task: Task | None, timeout_s: float, task_id: str = "") -> None:
        # task is None while waiting with missing_ok for a task not created yet
        what = f"still {task.status.name}" if task is not None else "does not exist yet"
        super().__init__(f"task {task.task_id if task is not None else task_id} {what} "
                         f"after {timeout_s}s")
        self.task = task


_RAISES = {TaskStatus.DEAD_LETTERED: TaskFailed, TaskStatus.CANCELLED: TaskCancelled,
           TaskStatus.EXPIRED: TaskExpired}


def outcome_error(task: Task) -> TaskNotSucceeded | None:
    """The exception for a terminal task that did not succeed; None otherwise."""
    exc = _RAISES.get(task.status)
    return exc(task) if exc is not None else None
