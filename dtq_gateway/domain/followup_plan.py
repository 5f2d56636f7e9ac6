"""Planning chains and groups at enqueue time: validation and derived task ids.

A chain step's task id is derived from the id of the task before it, and a group
callback's from the group id, so every attempt to create one (the gateway that took
the Ack, the leader's follow-up sweep) names the same task, and producers learn the
ids at enqueue time. See followups.py for how the tasks are created.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING

from dtq_gateway.domain import names
from dtq_gateway.domain.validation import NewTask, validate_enqueue
from dtq_gateway.errors import InvalidArgument
from dtq_proto import dtq_pb2

if TYPE_CHECKING:  # annotations only: the settings loader is wiring, above this leaf
    from dtq_gateway.settings import Settings

#: Most steps after the first task of a chain.
MAX_CHAIN_STEPS = 32


def step_task_id(previous_task_id: str, queue: str) -> str:
    """The task id of the chain step after ``previous_task_id``, which goes to ``queue``:
    32 hex characters derived from the previous id, ``-``, the queue's slot tag
    (names.slot_tag, so the step's record lives in its queue's hash slot).

    Derived, so every attempt to create the step (the Ack's gateway, the sweep) names
    the same task, and producers know every step's id at enqueue time.
    """
    digest = hashlib.sha256(f"dtq-chain:{previous_task_id}".encode()).hexdigest()[:32]
    return f"{digest}-{names.slot_tag(queue)}"


def callback_task_id(group_id: str, queue: str) -> str:
    """The task id of a group's callback, which goes to ``queue``: 32 hex characters
    derived from the group id, ``-``, the queue's slot tag (names.slot_tag)."""
    digest = hashlib.sha256(f"dtq-group:{group_id}".encode()).hexdigest()[:32]
    return f"{digest}-{names.slot_tag(queue)}"


def record_fields(*pairs: str) -> str:
    """Extra record fields for enqueue.lua as a flat JSON array [name, value, ...]."""
    return json.dumps(list(pairs), separators=(",", ":"))


def _check_template(step: dtq_pb2.EnqueueRequest, settings: Settings, prefix: str) -> None:
    """Refuse a chain step or group callback that cannot become a task."""
    if step.chain:
        raise InvalidArgument(f"{prefix}chain: must be empty here", field=prefix + "chain")
    if step.HasField("debounce"):
        raise InvalidArgument(f"{prefix}debounce: must be empty here",
                              field=prefix + "debounce")
    for name in ("idempotency_key", "traceparent", "tracestate"):
        if getattr(step, name):
            raise InvalidArgument(f"{prefix}{name}: must be empty here (dtq sets it)",
                                  field=prefix + name)
    validate_enqueue(step, settings, prefix=prefix)


def plan_chain(req: dtq_pb2.EnqueueRequest, task: NewTask, settings: Settings,
               prefix: str = "") -> tuple[NewTask, list[str]]:
    """Validate ``req.chain`` and attach it to ``task`` (the chain's first task).

    Args:
        req: the Enqueue request (or batch item) that holds the chain.
        task: the validated first task.
        settings: gateway settings.
        prefix: field-name prefix for batch items, e.g. ``"items[3]."``.

    Returns:
        The task with its chain record fields, and the ids the steps will have.

    Raises:
        InvalidArgument: too many steps, or a step is malformed (``chain[i].<field>``).
    """
    if not req.chain:
        return task, []
    if len(req.chain) > MAX_CHAIN_STEPS:
        raise InvalidArgument(f"{prefix}chain: at most {MAX_CHAIN_STEPS} steps",
                              field=prefix + "chain")
    for i, step in enumerate(req.chain):
        _check_template(step, settings, f"{prefix}chain[{i}].")
    ids, prev = [], task.task_id
    for step in req.chain:
        prev = step_task_id(prev, step.queue)
        ids.append(prev)
    templates = [base64.b64encode(s.SerializeToString()).decode() for s in req.chain]
    extra = record_fields("follow", "c", "chain_id", task.task_id, "chain_step", "0",
                          "chain_next", json.dumps(templates, separators=(",", ":")))
    return replace(task, extra_json=extra), ids


def plan_group(callback: dtq_pb2.EnqueueRequest, tasks: list[NewTask],
               settings: Settings) -> tuple[str, list[NewTask]]:
    """Validate a group callback and mark ``tasks`` as its members.

    Returns:
        (group id, the member tasks with their group record fields).

    Raises:
        InvalidArgument: the callback is malformed (``group_callback.<field>``).
    """
    _check_template(callback, settings, "group_callback.")
    group_id = uuid.uuid4().hex
    extra = record_fields("follow", "g", "group_id", group_id, "group_queue", callback.queue)
    return group_id, [replace(t, extra_json=extra) for t in tasks]

