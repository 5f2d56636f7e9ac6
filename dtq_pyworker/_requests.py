"""Request building and response decoding shared by Client and AsyncClient."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from dtq_proto import dtq_pb2
from dtq_pyworker.codec import encode_payload
from dtq_pyworker.errors import DtqRpcError
from dtq_pyworker.tasks import TaskStatus

TERMINAL_STATUSES = frozenset({
    dtq_pb2.TASK_STATUS_SUCCEEDED, dtq_pb2.TASK_STATUS_DEAD_LETTERED,
    dtq_pb2.TASK_STATUS_CANCELLED, dtq_pb2.TASK_STATUS_EXPIRED,
})

#: What a field of each protobuf integer type can hold (a value outside fails to encode).
_INT_RANGES = {FieldDescriptor.CPPTYPE_INT32: (-(1 << 31), (1 << 31) - 1),
               FieldDescriptor.CPPTYPE_UINT32: (0, (1 << 32) - 1),
               FieldDescriptor.CPPTYPE_INT64: (-(1 << 63), (1 << 63) - 1),
               FieldDescriptor.CPPTYPE_UINT64: (0, (1 << 64) - 1)}

_ENQUEUE_OPTIONS = ("content_type", "priority", "max_attempts", "timeout_ms",
                    "idempotency_key", "delay_ms", "not_before_ms", "expires_at_ms", "ttl_ms",
                    "retry_policy", "metadata", "traceparent", "tracestate", "debounce",
                    "concurrency_key", "required_labels")

#: Debounce modes by the names the client takes (``debounce={"mode": ...}``).
DEBOUNCE_MODES = {"keep_first": dtq_pb2.DEBOUNCE_MODE_KEEP_FIRST,
                  "keep_last": dtq_pb2.DEBOUNCE_MODE_KEEP_LAST}


@dataclass(frozen=True)
class EnqueueResult:
    """Outcome of one enqueue.

    Attributes:
        task_id: The new task's id, or the earlier one's when deduplicated.
        deduplicated: True when an earlier task with the idempotency key was returned.
        status: :class:`TaskStatus` right after the call (equal to the
            ``dtq_pb2.TaskStatus`` value).
    """

    task_id: str
    deduplicated: bool
    status: TaskStatus
    #: Ids the chain steps will have, in order (empty without a chain).
    chain_task_ids: tuple[str, ...] = ()
    #: True when the request's debounce absorbed it into the burst's task (task_id).
    debounced: bool = False


@dataclass(frozen=True)
class GroupResult:
    """Outcome of :meth:`Client.enqueue_group`.

    Attributes:
        group_id: The group's id.
        callback_task_id: Id the callback task gets once every member finished.
        results: Per member, in order: EnqueueResult or DtqRpcError (refused by the
            queue; the member then counts as finished with status "rejected").
    """

    group_id: str
    callback_task_id: str
    results: list[EnqueueResult | DtqRpcError]


def check_ints(message_type: Any, fields: Mapping[str, Any], prefix: str = "") -> None:
    """Refuse a value an integer field of ``message_type`` cannot hold, naming the field
    (protobuf's own errors, "Value out of range: N", name none). The gateway checks the
    ranges each field documents; this only keeps a value from failing to encode.

    Args:
        message_type: A generated message class, e.g. ``dtq_pb2.RateLimit``.
        fields: Field name to value; names that are not integer fields are skipped.
        prefix: Prepended to the field name in the message (e.g. ``"rate_limit."``).

    Raises:
        ValueError: ``<prefix><field>: must be LO..HI, got N``.
        TypeError: ``<prefix><field>: expected an integer, got TYPE``.
    """
    for name, value in fields.items():
        field = message_type.DESCRIPTOR.fields_by_name.get(name)
        bounds = _INT_RANGES.get(field.cpp_type) if field is not None else None
        if bounds is None or value is None:
            continue
        try:
            number = operator.index(value)
        except TypeError:
            raise TypeError(f"{prefix}{name}: expected an integer, got "
                            f"{type(value).__name__}") from None
        if not bounds[0] <= number <= bounds[1]:
            raise ValueError(f"{prefix}{name}: must be {bounds[0]}..{bounds[1]}, got {number}")


def new_message(message_type: Any, prefix: str = "", **fields: Any) -> Any:
    """``message_type(**fields)`` after :func:`check_ints` (same errors)."""
    check_ints(message_type, fields, prefix)
    return message_type(**fields)


def enqueue_request(queue: str, task_type: str, payload: Any = None, *,
                    content_type: str | None = None, priority: int | None = None,
                    max_attempts: int | None = None, timeout_ms: int | None = None,
                    idempotency_key: str | None = None, delay_ms: int | None = None,
                    not_before_ms: int | None = None, expires_at_ms: int | None = None,
                    ttl_ms: int | None = None,
                    retry_policy: Mapping[str, int] | dtq_pb2.RetryPolicy | None = None,
                    metadata: Mapping[str, str] | None = None,
                    chain: Sequence[Mapping[str, Any] | dtq_pb2.EnqueueRequest] | None = None, traceparent: str | None = None,
                    tracestate: str | None = None,
                    debounce: Mapping[str, Any] | dtq_pb2.Debounce | None = None,
                    concurrency_key: str | None = None,
                    required_labels: Mapping[str, str] | None = None,
                    _step: bool = False) -> dtq_pb2.EnqueueRequest:
    """Build an EnqueueRequest; None leaves a field to the gateway's default.

    ``payload`` bytes are sent as-is (default type application/octet-stream);
    anything else is JSON-encoded (application/json). ``retry_policy`` is a
    RetryPolicy or a dict with ``backoff_base_ms`` / ``backoff_cap_ms``. ``chain`` is a
    list of steps (dicts of these arguments with queue and task_type, or
    EnqueueRequest messages); a step without a payload receives the previous step's
    result as its payload. ``debounce`` is a Debounce message or a dict with ``key``,
    ``window_ms``, ``mode`` ("keep_first" or "keep_last") and, for keep_last,
    ``max_delay_ms`` (see docs/handlers.md, "Debounce"). ``concurrency_key``: at most
    the queue's per-key limit of tasks with this key run at once; ``required_labels``:
    only a worker whose labels contain them all leases the task (docs/fairness.md).

    Raises:
        ValueError, TypeError: An integer option its field cannot hold, or not an
            integer (:func:`check_ints`); the gateway checks the documented ranges.
    """
    if _step and payload is None:
        data, ctype = b"", content_type or ""
    else:
        data, ctype = encode_payload(payload, content_type)
    req = dtq_pb2.EnqueueRequest(queue=queue, task_type=task_type, payload=data,
                                 content_type=ctype)
    options = {"priority": priority, "max_attempts": max_attempts, "timeout_ms": timeout_ms,
               "idempotency_key": idempotency_key, "delay_ms": delay_ms,
               "not_before_ms": not_before_ms, "expires_at_ms": expires_at_ms,
               "ttl_ms": ttl_ms}
    check_ints(dtq_pb2.EnqueueRequest, options)
    for name, value in options.items():
        if value is not None:
            setattr(req, name, value)
    if retry_policy is not None:
        if isinstance(retry_policy, dtq_pb2.RetryPolicy):
            req.retry_policy.CopyFrom(retry_policy)
        else:
            req.retry_policy.CopyFrom(new_message(dtq_pb2.RetryPolicy, "retry_policy.",
                                                  **retry_policy))
    if metadata:
        req.metadata.update({str(k): str(v) for k, v in metadata.items()})
    if traceparent:
        req.traceparent = traceparent
        req.tracestate = tracestate or ""
    for step in chain or ():
        req.chain.append(template_request(step))
    if debounce is not None:
        req.debounce.CopyFrom(debounce_message(debounce))
    if concurrency_key:
        req.concurrency_key = concurrency_key
    if required_labels:
        req.required_labels.update({str(k): str(v) for k, v in required_labels.items()})
    return req


def debounce_message(debounce: Mapping[str, Any] | dtq_pb2.Debounce) -> dtq_pb2.Debounce:
    """A Debounce message from a dict of key, window_ms, mode, max_delay_ms.

    Raises:
        ValueError: ``mode`` is not "keep_first" or "keep_last" (or an integer
            its field cannot hold); the gateway checks the documented ranges.
    """
    if isinstance(debounce, dtq_pb2.Debounce):
        return debounce
    fields = dict(debounce)
    mode = fields.pop("mode", None)
    if mode not in DEBOUNCE_MODES:
        raise ValueError(f"debounce.mode: one of {sorted(DEBOUNCE_MODES)} (got {mode!r})")
    message: dtq_pb2.Debounce = new_message(dtq_pb2.Debounce, "debounce.",
                                            mode=DEBOUNCE_MODES[mode], **fields)
    return message


def template_request(step: Mapping[str, Any] | dtq_pb2.EnqueueRequest
                     ) -> dtq_pb2.EnqueueRequest:
    """A chain step or group callback from a dict of :func:`enqueue_request` arguments
    (or a ready EnqueueRequest): no payload means the gateway fills it in."""
    if isinstance(step, dtq_pb2.EnqueueRequest):
        return step
    item = dict(step)
    return enqueue_request(item.pop("queue"), item.pop("task_type"), item.pop("payload", None),
                           _step=True, **item)


def batch_request(items: Iterable[Mapping[str, Any] | dtq_pb2.EnqueueRequest]
                  ) -> dtq_pb2.EnqueueBatchRequest:
    """Build an EnqueueBatchRequest from dicts of :func:`enqueue_request` arguments
    (or ready EnqueueRequest messages)."""
    reqs: list[dtq_pb2.EnqueueRequest] = []
    for item in items:
        if isinstance(item, dtq_pb2.EnqueueRequest):
            reqs.append(item)
            continue
        fields = dict(item)
        unknown = set(fields) - {"queue", "task_type", "payload", "chain", *_ENQUEUE_OPTIONS}
        if unknown:
            raise TypeError(f"unknown enqueue options: {sorted(unknown)}")
        reqs.append(enqueue_request(fields.pop("queue"), fields.pop("task_type"),
                                    fields.pop("payload", None), **fields))
    return dtq_pb2.EnqueueBatchRequest(items=reqs)


def enqueue_result(resp: dtq_pb2.EnqueueResponse) -> EnqueueResult:
    """EnqueueResult from an EnqueueResponse."""
    return EnqueueResult(resp.task_id, resp.deduplicated, TaskStatus.of(resp.status),
                         tuple(resp.chain_task_ids), resp.debounced)


def batch_results(resp: dtq_pb2.EnqueueBatchResponse) -> list[EnqueueResult | DtqRpcError]:
    """Per-item results of EnqueueBatch: EnqueueResult or DtqRpcError."""
    out: list[EnqueueResult | DtqRpcError] = []
    for r in resp.results:
        if r.HasField("error") and r.error.code != 0:
            out.append(DtqRpcError.from_item_error(r.error))
        else:
            out.append(EnqueueResult(r.task_id, r.deduplicated, TaskStatus.of(r.status),
                                     tuple(r.chain_task_ids), r.debounced))
    return out


def is_terminal(task: dtq_pb2.Task) -> bool:
    """True when the task reached SUCCEEDED, DEAD_LETTERED, CANCELLED or EXPIRED."""
    return task.status in TERMINAL_STATUSES
