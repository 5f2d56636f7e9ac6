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

**Group** (EnqueueBatchRequest.group_callback): a group record
``dtq:group:<callback queue>:<group id>`` (in the callback queue's slot) holds the
callback template, the member ids and one ``m:<task id>`` outcome per finished member.
Members carry ``group_id``/``group_queue`` in their records. A member's terminal outcome
is recorded by ``group_member.lua`` (single key, idempotent, counts ``done``) right
after the Ack/Fail that ended it, and by the sweep for every other way a task ends
(reaper, expiry, cancel) or when a gateway died in between. When ``done`` reaches
``total`` the callback is enqueued once: id :func:`callback_task_id`, idempotency key
``group:<group id>``.

Record fields: chain members have ``chain_id`` and ``chain_step``; a step with later
steps has ``chain_next``; ``next_task_id`` once the next step exists; ``chain_error``
when a step could not be built. Group members have ``group_id`` and ``group_queue``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import logging
import uuid
from dataclasses import dataclass, replace
from typing import Any

from redis.asyncio import Redis

from dtq_gateway import keys
from dtq_gateway.broker import Broker, Enqueued
from dtq_gateway.duty import PeriodicDuty
from dtq_gateway.errors import DtqError, InvalidArgument
from dtq_gateway.replies import text as _s
from dtq_gateway.scripts import Script
from dtq_gateway.settings import Settings
from dtq_gateway.validation import NewTask, validate_enqueue
from dtq_proto import dtq_pb2

log = logging.getLogger(__name__)

CHAIN_CONTINUED = Script("chain_continued")
GROUP_MEMBER = Script("group_member")
#: Most steps after the first task of a chain.
MAX_CHAIN_STEPS = 32
#: Metadata key naming the previous step of a chain step.
PARENT_KEY = "dtq.parent_task_id"
#: Metadata key naming the group of a group callback.
GROUP_KEY = "dtq.group_id"
#: Statuses after which a task never changes again.
TERMINAL = frozenset({"succeeded", "dead_lettered", "cancelled", "expired"})
#: A group whose member list was never written (its EnqueueBatch call died) is
#: abandoned this long after its creation (ms).
ABANDON_AFTER_MS = 60_000
#: The sweep leaves chain steps younger than this to the gateway that took the Ack (ms).
SWEEP_GRACE_MS = 5_000
#: Longest wait between two checks of an unfinished group by the sweep (ms).
MAX_GROUP_CHECK_MS = 60_000
#: Chain steps and groups handled per queue per sweep tick.
SWEEP_BATCH = 100


def step_task_id(previous_task_id: str) -> str:
    """The task id of the chain step after ``previous_task_id`` (32 hex characters).

    Derived, so every attempt to create the step (the Ack's gateway, the sweep) names
    the same task, and producers know every step's id at enqueue time.
    """
    return hashlib.sha256(f"dtq-chain:{previous_task_id}".encode()).hexdigest()[:32]


def callback_task_id(group_id: str) -> str:
    """The task id of a group's callback (32 hex characters), derived from the group id."""
    return hashlib.sha256(f"dtq-group:{group_id}".encode()).hexdigest()[:32]


def _fields(*pairs: str) -> str:
    """Extra record fields for enqueue.lua as a flat JSON array."""
    return json.dumps(list(pairs), separators=(",", ":"))


def _check_template(step: dtq_pb2.EnqueueRequest, settings: Settings, prefix: str) -> None:
    """Refuse a chain step or group callback that cannot become a task."""
    for name in ("chain",):
        if getattr(step, name):
            raise InvalidArgument(f"{prefix}{name}: must be empty here", field=prefix + name)
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
    for _ in req.chain:
        prev = step_task_id(prev)
        ids.append(prev)
    templates = [base64.b64encode(s.SerializeToString()).decode() for s in req.chain]
    extra = _fields("chain_id", task.task_id, "chain_step", "0",
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
    extra = _fields("group_id", group_id, "group_queue", callback.queue)
    return group_id, [replace(t, extra_json=extra) for t in tasks]


def _result_entry(result: bytes | None) -> dict[str, Any]:
    """A member's result for the callback payload: JSON when it is JSON, else base64."""
    if not result:
        return {}
    try:
        return {"result": json.loads(result)}
    except (UnicodeDecodeError, ValueError):
        return {"result_base64": base64.b64encode(result).decode()}


@dataclass(frozen=True, slots=True)
class GroupState:
    """A group record as read: its members, and the outcomes recorded so far."""

    callback: bytes
    members: list[str] | None
    outcomes: dict[str, dict]
    created_at_ms: int
    state: str


class FollowUps:
    """Creates chain steps and group callbacks (see the module docstring).

    Args:
        redis: the gateway's client.
        settings: gateway settings (retention, payload limit).
        broker: enqueues the follow-up tasks.
    """

    def __init__(self, redis: Redis, settings: Settings, broker: Broker) -> None:
        self.redis = redis
        self.settings = settings
        self.broker = broker
        #: The sweep leaves chain steps owed for less than this to the gateway that
        #: took the Ack (ms).
        self.sweep_grace_ms = SWEEP_GRACE_MS
        self._tasks: set[asyncio.Task] = set()

    # -- producer side --------------------------------------------------------------
    async def register_queue(self, queue: str) -> None:
        """Let the sweep look at ``queue`` (before anything there can owe follow-ups)."""
        await self.redis.sadd(keys.FOLLOWUP_QUEUES, queue)

    async def create_group(self, group_id: str, callback: dtq_pb2.EnqueueRequest,
                           members: list[NewTask]) -> list[Enqueued | Exception]:
        """Store the group record, enqueue its members, then write the member list.

        A group whose member list never gets written (this gateway died during the
        call, which the producer saw fail) is abandoned by the sweep after
        ``ABANDON_AFTER_MS``. Members refused by the enqueue (QueueFull, a Redis error)
        count as finished with status "rejected".
        """
        queue = callback.queue
        await self.register_queue(queue)
        now_ms = await self._now_ms()
        pipe = self.redis.pipeline(transaction=True)  # one queue's keys: one slot
        pipe.hset(keys.group(queue, group_id), mapping={
            "callback": callback.SerializeToString(), "total": len(members), "done": 0,
            "created_at_ms": now_ms, "state": "open"})
        pipe.zadd(keys.groups_pending(queue), {group_id: now_ms + SWEEP_GRACE_MS})
        await pipe.execute()
        outs = await self.broker.enqueue_many(members)
        ids = [o.task_id if isinstance(o, Enqueued) else f"rejected-{i}"
               for i, o in enumerate(outs)]
        await self.redis.hset(keys.group(queue, group_id), "members",
                              json.dumps(ids, separators=(",", ":")))
        for i, o in enumerate(outs):
            if not isinstance(o, Enqueued):
                await self._record_member(queue, group_id, ids[i], {
                    "status": "rejected", "error_class": type(o).__name__, "error": str(o)})
        await self.check_group(queue, group_id)
        return outs

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
                await self.member_finished(task_id)
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
            DtqError, redis errors: the step could not be enqueued now (it stays owed).
        """
        f = await self.redis.hmget(keys.task(task_id), "status", "chain_next", "chain_id",
                                   "chain_step", "next_task_id", "metadata")
        status, chain_next = _s(f[0] or b""), f[1]
        if status != "succeeded" or not chain_next or f[4]:
            await self._continued(queue, task_id, "", "")
            return _s(f[4] or b"")
        next_id = step_task_id(task_id)
        if not await self.redis.exists(keys.task(next_id)):
            try:
                step = await self._build_step(task_id, f, next_id)
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

    async def _build_step(self, task_id: str, f: list, next_id: str) -> NewTask:
        templates = json.loads(f[1])
        tmpl = dtq_pb2.EnqueueRequest.FromString(base64.b64decode(templates[0]))
        if not tmpl.payload:
            tmpl.payload = await self.redis.get(keys.result(task_id)) or b""
            if tmpl.payload and (tmpl.content_type or "application/json") == "application/json":
                try:
                    json.loads(tmpl.payload)
                except (UnicodeDecodeError, ValueError):
                    tmpl.content_type = "application/octet-stream"
        tmpl.metadata[PARENT_KEY] = task_id
        meta = _json_obj(f[5])
        trace = (str(meta.get("traceparent", "")), str(meta.get("tracestate", "")))
        if len(templates) > 1:  # the step will owe the next one: let the sweep see it
            await self.register_queue(tmpl.queue)
        step = validate_enqueue(tmpl, self.settings, trace=trace)
        idem = f"chain:{task_id}"
        pairs = ["chain_id", _s(f[2] or task_id.encode()),
                 "chain_step", str(int(_s(f[3] or b"0")) + 1)]
        if len(templates) > 1:
            pairs += ["chain_next", json.dumps(templates[1:], separators=(",", ":"))]
        return replace(step, task_id=next_id, idem_key=idem,
                       idem_digest=keys.idempotency_digest(idem), extra_json=_fields(*pairs))

    async def _continued(self, queue: str, task_id: str, next_id: str, error: str) -> None:
        await CHAIN_CONTINUED(self.redis, [keys.task(task_id), keys.chain_pending(queue)],
                              Script.argv(task_id, next_id, error))

    # -- groups ---------------------------------------------------------------------
    async def member_finished(self, task_id: str) -> None:
        """Record a terminal member's outcome in its group; enqueue the callback when it
        was the last."""
        f = await self.redis.hmget(keys.task(task_id), "status", "group_id", "group_queue",
                                   "last_error_class", "last_error")
        status, group_id, queue = _s(f[0] or b""), _s(f[1] or b""), _s(f[2] or b"")
        if status not in TERMINAL or not keys.TASK_ID_RE.match(group_id) \
                or not keys.QUEUE_RE.match(queue):
            return
        done, total = await self._record_member(queue, group_id, task_id, _outcome(f))
        if total and done >= total:
            await self.check_group(queue, group_id)

    async def _record_member(self, queue: str, group_id: str, task_id: str,
                             outcome: dict) -> tuple[int, int]:
        done, total = await GROUP_MEMBER(
            self.redis, [keys.group(queue, group_id)],
            Script.argv(task_id, json.dumps(outcome, separators=(",", ":"))))
        return int(done), int(total)

    async def _read_group(self, queue: str, group_id: str) -> GroupState | None:
        h = await self.redis.hgetall(keys.group(queue, group_id))
        if not h:
            return None
        members = json.loads(h[b"members"]) if b"members" in h else None
        outcomes = {_s(k)[2:]: json.loads(v) for k, v in h.items() if k.startswith(b"m:")}
        return GroupState(h.get(b"callback", b""), members, outcomes,
                          int(h.get(b"created_at_ms", 0)), _s(h.get(b"state", b"")))

    async def check_group(self, queue: str, group_id: str, now_ms: int = 0) -> bool:
        """Record every finished member, and enqueue the callback once all finished.

        Returns:
            True when the group is finished (or gone), False while members still run.
        """
        g = await self._read_group(queue, group_id)
        pending = keys.groups_pending(queue)
        if g is None or g.state in ("done", "abandoned"):
            await self.redis.zrem(pending, group_id)
            return True
        now_ms = now_ms or await self._now_ms()
        if g.members is None:
            if now_ms - g.created_at_ms > ABANDON_AFTER_MS:
                log.warning("group abandoned: its member list was never written",
                            extra={"group_id": group_id, "queue": queue})
                await self._finish_group(queue, group_id, "abandoned", "")
                return True
            return False
        missing = [m for m in g.members if m not in g.outcomes]
        if missing:
            pipe = self.redis.pipeline(transaction=False)
            for m in missing:
                pipe.hmget(keys.task(m), "status", "group_id", "group_queue",
                           "last_error_class", "last_error")
            for m, f in zip(missing, await pipe.execute()):
                status = _s(f[0] or b"")
                if status in TERMINAL or not f[0]:
                    outcome = _outcome(f) if f[0] else {"status": "unknown"}
                    await self._record_member(queue, group_id, m, outcome)
                    g.outcomes[m] = outcome
        if any(m not in g.outcomes for m in g.members):
            age = max(1, now_ms - g.created_at_ms)
            await self.redis.zadd(pending, {group_id: now_ms + min(MAX_GROUP_CHECK_MS, age)},
                                  xx=True)
            return False
        await self._enqueue_callback(queue, group_id, g)
        return True

    async def _enqueue_callback(self, queue: str, group_id: str, g: GroupState) -> None:
        cb_id = callback_task_id(group_id)
        if not await self.redis.exists(keys.task(cb_id)):
            tmpl = dtq_pb2.EnqueueRequest.FromString(g.callback)
            tmpl.metadata[GROUP_KEY] = group_id
            if not tmpl.payload:
                tmpl.payload = await self._callback_payload(group_id, g)
                tmpl.content_type = "application/json"
            task = validate_enqueue(tmpl, self.settings)
            idem = f"group:{group_id}"
            (out,) = await self.broker.enqueue_many([replace(
                task, task_id=cb_id, idem_key=idem, idem_digest=keys.idempotency_digest(idem))])
            if isinstance(out, Exception):
                raise out
        await self._finish_group(queue, group_id, "done", cb_id)

    async def _callback_payload(self, group_id: str, g: GroupState) -> bytes:
        budget = self.settings.max_payload_bytes // 2
        members = []
        ok = [m for m in g.members if g.outcomes[m].get("status") == "succeeded"]
        results = dict(zip(ok, await self.redis.mget([keys.result(m) for m in ok]))) if ok else {}
        for m in g.members:
            entry = {"task_id": "" if m.startswith("rejected-") else m, **g.outcomes[m]}
            res = _result_entry(results.get(m))
            size = sum(len(str(v)) for v in res.values())
            if size > budget:
                entry["result_omitted"] = True
            else:
                budget -= size
                entry.update(res)
            members.append(entry)
        return json.dumps({"group_id": group_id, "members": members},
                          separators=(",", ":")).encode()

    async def _finish_group(self, queue: str, group_id: str, state: str, cb_id: str) -> None:
        pipe = self.redis.pipeline(transaction=True)  # one queue's keys: one slot
        pipe.hset(keys.group(queue, group_id), mapping={"state": state, "callback_task_id": cb_id})
        pipe.expire(keys.group(queue, group_id), self.settings.task_retention_s)
        pipe.zrem(keys.groups_pending(queue), group_id)
        await pipe.execute()

    # -- sweep ----------------------------------------------------------------------
    async def _now_ms(self) -> int:
        sec, usec = await self.redis.time()
        return int(sec) * 1000 + int(usec) // 1000

    async def sweep(self) -> dict[str, int]:
        """One pass over every registered queue: owed chain steps older than
        ``sweep_grace_ms`` and groups due for a check. Returns counts."""
        now_ms = await self._now_ms()
        counts = {"chain_steps": 0, "groups_finished": 0, "errors": 0}
        for raw in await self.redis.smembers(keys.FOLLOWUP_QUEUES):
            queue = _s(raw)
            if not keys.QUEUE_RE.match(queue):
                continue
            owed = await self.redis.zrangebyscore(keys.chain_pending(queue), "-inf",
                                                  now_ms - self.sweep_grace_ms, 0, SWEEP_BATCH)
            for task_id in owed:
                try:
                    if await self.continue_chain(queue, _s(task_id)):
                        counts["chain_steps"] += 1
                except Exception as exc:  # noqa: BLE001 - retried next tick
                    counts["errors"] += 1
                    log.warning("sweep: chain step failed: %r", exc,
                                extra={"task_id": _s(task_id)})
            due = await self.redis.zrangebyscore(keys.groups_pending(queue), "-inf", now_ms,
                                                 0, SWEEP_BATCH)
            for gid in due:
                try:
                    if await self.check_group(queue, _s(gid), now_ms):
                        counts["groups_finished"] += 1
                except Exception as exc:  # noqa: BLE001 - retried next tick
                    counts["errors"] += 1
                    log.warning("sweep: group check failed: %r", exc,
                                extra={"group_id": _s(gid)})
        return counts


def _outcome(f: list) -> dict[str, str]:
    """A member outcome from HMGET status, group_id, group_queue, error class, error."""
    return {"status": _s(f[0] or b""), "error_class": _s(f[3] or b""),
            "error": _s(f[4] or b"")[:1024]}


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
