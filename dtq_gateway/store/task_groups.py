"""Task groups: record each member's outcome, enqueue the callback once all finished.

The group record ``dtq:group:<callback queue>:<group id>`` (in the callback queue's
slot) holds the callback template, the member ids and one ``m:<task id>`` outcome per
finished member; members carry ``group_id``/``group_queue`` in their records. A
member's terminal outcome is recorded by ``group_member.lua`` (single key,
idempotent, counts ``done``) right after the Ack/Fail that ended it, and by the
follow-up sweep (followups.py) for every other way a task ends (reaper, expiry,
cancel) or when a gateway died in between. When ``done`` reaches ``total`` the
callback is enqueued once: id :func:`~dtq_gateway.domain.followup_plan.callback_task_id`,
idempotency key ``group:<group id>``.
"""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass, replace
from typing import Any, cast

from dtq_gateway.domain.followup_plan import callback_task_id
from dtq_gateway.domain.validation import NewTask, validate_enqueue
from dtq_gateway.settings import Settings
from dtq_gateway.store import keys
from dtq_gateway.store.admin_common import redis_now_ms
from dtq_gateway.store.broker import Broker, Enqueued
from dtq_gateway.store.client import Client
from dtq_gateway.store.replies import text as as_text
from dtq_gateway.store.scripts import Script
from dtq_proto import dtq_pb2

log = logging.getLogger(__name__)

GROUP_MEMBER = Script("group_member")
#: Metadata key naming the group of a group callback.
GROUP_KEY = "dtq.group_id"
#: Statuses after which a task never changes again.
TERMINAL = frozenset({"succeeded", "dead_lettered", "cancelled", "expired"})
#: A group whose member list was never written (its EnqueueBatch call died) is
#: abandoned this long after its creation (ms).
ABANDON_AFTER_MS = 60_000
#: The sweep's first look at a new group, after its creation (ms).
FIRST_CHECK_MS = 5_000
#: Longest error text per member in a callback payload (characters).
MAX_ERROR_CHARS = 256
#: Longest wait between two checks of an unfinished group by the sweep (ms).
MAX_GROUP_CHECK_MS = 60_000


def _result_entry(result: bytes | None) -> dict[str, Any]:
    """A member's result for the callback payload: JSON when it is JSON, else base64."""
    if not result:
        return {}
    try:
        return {"result": json.loads(result)}
    except (UnicodeDecodeError, ValueError):
        return {"result_base64": base64.b64encode(result).decode()}


@dataclass(frozen=True, slots=True)
class GroupProgress:
    """group_member.lua's reply, decoded (:meth:`of`): ``done`` members recorded so
    far and ``total`` members of the group (0 while it is still being created); ``done``
    is -1 when the group record is gone."""

    done: int
    total: int

    @classmethod
    def of(cls, reply: list[Any]) -> GroupProgress:
        """Decode ``{done, total}``."""
        return cls(int(reply[0]), int(reply[1]))

    @property
    def finished(self) -> bool:
        """Every member of a created group is recorded."""
        return bool(self.total) and self.done >= self.total


@dataclass(frozen=True, slots=True)
class GroupState:
    """A group record as read: its members, and the outcomes recorded so far."""

    callback: bytes
    members: list[str] | None
    outcomes: dict[str, dict]
    created_at_ms: int
    state: str


class TaskGroups:
    """Creates groups and enqueues their callbacks (see the module docstring).

    Args:
        redis: the gateway's client.
        settings: gateway settings (retention, payload limit).
        broker: enqueues the members and the callback.
    """

    def __init__(self, redis: Client, settings: Settings, broker: Broker) -> None:
        self.redis = redis
        self.settings = settings
        self.broker = broker

    async def create_group(self, group_id: str, callback: dtq_pb2.EnqueueRequest,
                           members: list[NewTask]) -> list[Enqueued | Exception]:
        """Store the group record, enqueue its members, then write the member list.

        A group whose member list never gets written (this gateway died during the
        call, which the producer saw fail) is abandoned by the sweep after
        ``ABANDON_AFTER_MS``. Members refused by the enqueue (QueueFull, a Redis error)
        count as finished with status "rejected".
        """
        queue = callback.queue
        await self.redis.sadd(keys.FOLLOWUP_QUEUES, queue)  # the sweep must see the group
        now_ms = await redis_now_ms(self.redis)
        pipe = self.redis.pipeline(transaction=True)  # one queue's keys: one slot
        pipe.hset(keys.group(queue, group_id), mapping={
            "callback": callback.SerializeToString(), "total": len(members), "done": 0,
            "created_at_ms": now_ms, "state": "open"})
        pipe.zadd(keys.groups_pending(queue), {group_id: now_ms + FIRST_CHECK_MS})
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
        try:  # every member may already have ended (deduplicated to finished tasks)
            await self.check_group(queue, group_id)
        except Exception as exc:  # noqa: BLE001 - the members are stored: the sweep finishes
            log.warning("group check deferred to the sweep: %r", exc,
                        extra={"group_id": group_id, "queue": queue})
        return outs

    async def member_finished(self, task_id: str) -> None:
        """Record a terminal member's outcome in its group; enqueue the callback when it
        was the last."""
        f = await self.redis.hmget(keys.task(task_id), "status", "group_id", "group_queue",
                                   "last_error_class", "last_error")
        status, group_id, queue = as_text(f[0] or b""), as_text(f[1] or b""), as_text(f[2] or b"")
        if status not in TERMINAL or not keys.TASK_ID_RE.match(group_id) \
                or not keys.QUEUE_RE.match(queue):
            return
        progress = await self._record_member(queue, group_id, task_id, _outcome(f))
        if progress.finished:
            await self.check_group(queue, group_id)

    async def _record_member(self, queue: str, group_id: str, task_id: str,
                             outcome: dict) -> GroupProgress:
        return GroupProgress.of(await GROUP_MEMBER(
            self.redis, [keys.group(queue, group_id)],
            Script.argv(task_id, json.dumps(outcome, separators=(",", ":")))))

    async def _read_group(self, queue: str, group_id: str) -> GroupState | None:
        # the client never decodes replies: fields and values arrive as bytes
        h = cast(dict[bytes, bytes], await self.redis.hgetall(keys.group(queue, group_id)))
        if not h:
            return None
        members = json.loads(h[b"members"]) if b"members" in h else None
        outcomes = {as_text(k)[2:]: json.loads(v) for k, v in h.items() if k.startswith(b"m:")}
        return GroupState(h.get(b"callback", b""), members, outcomes,
                          int(h.get(b"created_at_ms", 0)), as_text(h.get(b"state", b"")))

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
        now_ms = now_ms or await redis_now_ms(self.redis)
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
                status = as_text(f[0] or b"")
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
        cb_id = callback_task_id(group_id, queue)
        if not await self.redis.exists(keys.task(cb_id)):
            tmpl = dtq_pb2.EnqueueRequest.FromString(g.callback)
            tmpl.metadata[GROUP_KEY] = group_id
            if not tmpl.payload:
                tmpl.payload = await self._callback_payload(group_id, g, with_results=True)
                tmpl.content_type = "application/json"
                if len(tmpl.payload) > self.settings.max_payload_bytes:
                    tmpl.payload = await self._callback_payload(group_id, g, with_results=False)
            task = validate_enqueue(tmpl, self.settings)
            idem = f"group:{group_id}"
            (out,) = await self.broker.enqueue_many([replace(
                task, task_id=cb_id, idem_key=idem, idem_digest=keys.internal_idempotency_digest(idem))])
            if isinstance(out, Exception):
                raise out
        await self._finish_group(queue, group_id, "done", cb_id)

    async def _callback_payload(self, group_id: str, g: GroupState, with_results: bool) -> bytes:
        """The callback's JSON payload; results take at most half of
        DTQ_MAX_PAYLOAD_BYTES (none at all without ``with_results``)."""
        budget = self.settings.max_payload_bytes // 2 if with_results else 0
        assert g.members is not None  # a group's callback is built once its members are known
        members = []
        ok = [m for m in g.members if with_results
              and g.outcomes[m].get("status") == "succeeded"]
        found = cast(list[bytes | None], await self.redis.mget([keys.result(m) for m in ok])
                     if ok else [])  # the client never decodes replies
        results = dict(zip(ok, found))
        for m in g.members:
            entry = {"task_id": "" if m.startswith("rejected-") else m, **g.outcomes[m]}
            entry["error"] = str(entry.get("error", ""))[:MAX_ERROR_CHARS]
            res = _result_entry(results.get(m))
            size = len(json.dumps(res))
            if res and size <= budget:
                budget -= size
                entry.update(res)
            elif entry.get("status") == "succeeded" and (res or not with_results):
                entry["result_omitted"] = True
            members.append(entry)
        return json.dumps({"group_id": group_id, "members": members},
                          separators=(",", ":")).encode()

    async def _finish_group(self, queue: str, group_id: str, state: str, cb_id: str) -> None:
        pipe = self.redis.pipeline(transaction=True)  # one queue's keys: one slot
        pipe.hset(keys.group(queue, group_id), mapping={"state": state, "callback_task_id": cb_id})
        pipe.expire(keys.group(queue, group_id), self.settings.task_retention_s)
        pipe.zrem(keys.groups_pending(queue), group_id)
        await pipe.execute()


def _outcome(f: list) -> dict[str, str]:
    """A member outcome from HMGET status, group_id, group_queue, error class, error."""
    return {"status": as_text(f[0] or b""), "error_class": as_text(f[3] or b""),
            "error": as_text(f[4] or b"")[:1024]}

