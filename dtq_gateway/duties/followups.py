"""Chains and groups: tasks created once earlier tasks finished.

**Chain** (EnqueueRequest.chain): task A carries its later steps as templates in its
record (``chain_next``: JSON list of base64 EnqueueRequest bytes). A's ack.lua call adds
A to its queue's chain-pending set in the same script that makes A succeeded, so "B is
owed" can never be lost. The gateway that took the Ack then creates B (payload: the
template's, or A's result when the template's is empty) with a task id derived from A's
(:func:`step_task_id`) and the idempotency key ``chain:<A id>``, and finally marks A
continued (``chain_continued.lua``). A gateway that dies in between leaves A in the
pending set; the leader's :class:`FollowUpSweep` repeats the step, and the derived id
plus the idempotency key make the repeat create nothing twice. B's queue may live in
another Redis Cluster slot than A's: the steps touch one queue's keys each.

**Group** (EnqueueBatchRequest.group_callback): see task_groups.py. This module runs
its part after a member's Ack/Fail and in the sweep.

Record fields: ``follow`` ('c' a chain step follows, 'g' a group member: the one field
ack.lua and fail.lua read); chain members have ``chain_id`` and ``chain_step``; a step
with later steps has ``chain_next``; ``next_task_id`` once the next step exists; ``chain_error``
when a step could not be built. Group members have ``group_id`` and ``group_queue``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from dataclasses import replace
from typing import Any

from dtq_gateway.domain.followup_plan import record_fields, step_task_id
from dtq_gateway.domain.validation import NewTask, validate_enqueue
from dtq_gateway.duties.duty import PeriodicDuty
from dtq_gateway.errors import DtqError
from dtq_gateway.logconf import RateLimitedLog
from dtq_gateway.settings import Settings
from dtq_gateway.store import followups as followup_store
from dtq_gateway.store.admin import redis_now_ms
from dtq_gateway.store.broker import Broker, Enqueued
from dtq_gateway.store.client import Client
from dtq_gateway.store.keys import internal_idempotency_digest
from dtq_gateway.store.task_groups import TaskGroups
from dtq_proto import dtq_pb2

log = logging.getLogger(__name__)
#: Metadata key naming the previous step of a chain step.
PARENT_KEY = "dtq.parent_task_id"
#: The sweep leaves chain steps younger than this to the gateway that took the Ack (ms).
SWEEP_GRACE_MS = 5_000
#: Chain steps and groups handled per queue per sweep tick.
SWEEP_BATCH = 100
#: The sweep logs failed chain steps (and failed group checks) at most this often (s):
#: a cause that lasts, e.g. a queue at its depth limit, fails them again every tick.
SWEEP_LOG_EVERY_S = 60.0


class FollowUps:
    """Creates chain steps and group callbacks (see the module docstring).

    Args:
        redis: the gateway's client.
        settings: gateway settings (retention, payload limit).
        broker: enqueues the follow-up tasks.
    """

    def __init__(self, redis: Client, settings: Settings, broker: Broker) -> None:
        self.redis = redis
        self.settings = settings
        self.broker = broker
        #: The sweep leaves chain steps owed for less than this to the gateway that
        #: took the Ack (ms).
        self.sweep_grace_ms = SWEEP_GRACE_MS
        self.groups = TaskGroups(redis, settings, broker)
        self._tasks: set[asyncio.Task] = set()
        self._step_log = RateLimitedLog(log, every_s=SWEEP_LOG_EVERY_S)
        self._group_log = RateLimitedLog(log, every_s=SWEEP_LOG_EVERY_S)

    # -- producer side --------------------------------------------------------------
    async def register_queue(self, queue: str) -> None:
        """Let the sweep look at ``queue`` (before anything there can owe follow-ups)."""
        await followup_store.register_queue(self.redis, queue)

    async def create_group(self, group_id: str, callback: dtq_pb2.EnqueueRequest,
                           members: list[NewTask]) -> list[Enqueued | Exception]:
        """Store a group and enqueue its members (:meth:`TaskGroups.create_group`)."""
        return await self.groups.create_group(group_id, callback, members)

    # -- after a lease ended -------------------------------------------------------
    def after_outcome(self, outcome: Any) -> None:
        """Completion.on_follow: create what a finished lease owes, in the background
        (the Ack/Fail answer does not wait; the sweep finishes what fails here)."""
        le = outcome.lease
        task = asyncio.get_running_loop().create_task(
            self._after(le.queue, le.task_id, outcome.follow))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _after(self, queue: str, task_id: str, follow: str) -> None:
        try:
            if "c" in follow:
                await self.continue_chain(queue, task_id)
            if "g" in follow:
                await self.groups.member_finished(task_id)
        except Exception as exc:  # noqa: BLE001 - the sweep repeats it
            log.warning("follow-up deferred to the sweep: %r", exc,
                        extra={"task_id": task_id, "queue": queue})

    async def drain(self) -> None:
        """Wait for the follow-ups started by :meth:`after_outcome` (shutdown, tests)."""
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # -- chains ---------------------------------------------------------------------
    async def continue_chain(self, queue: str, task_id: str) -> str:
        """Create the chain step after ``task_id`` (of ``queue``) once; returns its id
        ("" when none is owed). Safe to repeat and to run concurrently.

        Raises:
            DtqError, Redis errors: the step could not be enqueued now (it stays owed).
        """
        link = await followup_store.chain_link(self.redis, task_id)
        if link.status != "succeeded" or not link.chain_next or link.next_task_id:
            await self._continued(queue, task_id, "", "")
            return link.next_task_id
        first = json.loads(link.chain_next)[0]
        next_id = step_task_id(task_id, dtq_pb2.EnqueueRequest.FromString(
            base64.b64decode(first)).queue)
        if not await followup_store.task_exists(self.redis, next_id):
            try:
                step = await self._build_step(task_id, link, next_id)
            except DtqError as exc:  # e.g. an expires_at_ms that passed meanwhile
                log.warning("chain step cannot be created: %s", exc,
                            extra={"task_id": task_id, "next_task_id": next_id})
                await self._continued(queue, task_id, "", str(exc)[:512])
                return ""
            (out,) = await self.broker.enqueue_many([step])
            if isinstance(out, Exception):
                raise out
        await self._continued(queue, task_id, next_id, "")
        return next_id

    async def _build_step(self, task_id: str, link: followup_store.ChainLink, next_id: str
                          ) -> NewTask:
        templates = json.loads(link.chain_next)
        tmpl = dtq_pb2.EnqueueRequest.FromString(base64.b64decode(templates[0]))
        if not tmpl.payload:
            tmpl.payload = await followup_store.task_result(self.redis, task_id)
            if tmpl.payload and (tmpl.content_type or "application/json") == "application/json":
                try:
                    json.loads(tmpl.payload)
                except (UnicodeDecodeError, ValueError):
                    tmpl.content_type = "application/octet-stream"
        tmpl.metadata[PARENT_KEY] = task_id
        meta = _json_obj(link.metadata)
        trace = (str(meta.get("traceparent", "")), str(meta.get("tracestate", "")))
        if len(templates) > 1:  # the step will owe the next one: let the sweep see it
            await self.register_queue(tmpl.queue)
        step = validate_enqueue(tmpl, self.settings, trace=trace)
        idem = f"chain:{task_id}"
        pairs = ["chain_id", link.chain_id or task_id,
                 "chain_step", str(int(link.chain_step or "0") + 1)]
        if len(templates) > 1:
            pairs = ["follow", "c", *pairs,
                     "chain_next", json.dumps(templates[1:], separators=(",", ":"))]
        return replace(step, task_id=next_id, idem_key=idem,
                       idem_digest=internal_idempotency_digest(idem), extra_json=record_fields(*pairs))

    async def _continued(self, queue: str, task_id: str, next_id: str, error: str) -> None:
        await followup_store.mark_continued(self.redis, queue, task_id, next_id, error)

    # -- sweep ----------------------------------------------------------------------
    async def sweep(self) -> dict[str, int]:
        """One pass over every registered queue: owed chain steps older than
        ``sweep_grace_ms`` and groups due for a check. Returns counts.

        A failed step or check stays owed and is retried at the next pass; failures
        are logged (WARNING) at most once per SWEEP_LOG_EVERY_S for chain steps and
        once for groups, with the number of failures not logged since, and at once
        again after a pass where that kind had no failure."""
        now_ms = await redis_now_ms(self.redis)
        counts = {"chain_steps": 0, "groups_finished": 0, "errors": 0}
        step_errors = group_errors = 0
        for queue in await followup_store.queues(self.redis):
            owed = await followup_store.chain_steps_owed(
                self.redis, queue, now_ms - self.sweep_grace_ms, SWEEP_BATCH)
            for task_id in owed:
                try:
                    if await self.continue_chain(queue, task_id):
                        counts["chain_steps"] += 1
                except Exception as exc:  # noqa: BLE001 - retried next tick
                    step_errors += 1
                    self._step_log.log(logging.WARNING, "sweep: chain step failed: %r", exc,
                                       task_id=task_id, queue=queue)
            due = await followup_store.groups_due(self.redis, queue, now_ms, SWEEP_BATCH)
            for gid in due:
                try:
                    if await self.groups.check_group(queue, gid, now_ms):
                        counts["groups_finished"] += 1
                except Exception as exc:  # noqa: BLE001 - retried next tick
                    group_errors += 1
                    self._group_log.log(logging.WARNING, "sweep: group check failed: %r",
                                        exc, group_id=gid, queue=queue)
        if not step_errors:
            self._step_log.reset()
        if not group_errors:
            self._group_log.reset()
        counts["errors"] = step_errors + group_errors
        return counts


def _json_obj(raw: bytes | None) -> dict:
    try:
        value = json.loads(raw or b"{}")
    except (UnicodeDecodeError, ValueError, binascii.Error):
        return {}
    return value if isinstance(value, dict) else {}


class FollowUpSweep(PeriodicDuty):
    """Leader duty: :meth:`FollowUps.sweep` every ``interval_s`` seconds.

    Args:
        followups: the gateway's FollowUps.
        lock: the scheduler lock (the sweep runs on the leader only).
        interval_s: seconds between passes.
    """

    name = "follow-up-sweep"

    def __init__(self, followups: FollowUps, lock: Any, interval_s: float = 2.0) -> None:
        super().__init__()
        self.followups = followups
        self.lock = lock
        self._interval_s = interval_s

    def interval_s(self) -> float:
        """Seconds between passes (before jitter)."""
        return self._interval_s

    def active(self) -> bool:
        """Only the scheduler leader sweeps."""
        return self.lock.is_leader

    async def tick(self) -> None:
        """One sweep pass; logs what it completed."""
        counts = await self.followups.sweep()
        if counts["chain_steps"] or counts["groups_finished"]:
            log.info("follow-up sweep: %s", counts)
