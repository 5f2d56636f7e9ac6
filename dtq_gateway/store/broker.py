"""Producer-side operations: enqueue, get, cancel.

Each state change is one Lua script (see lua/), so a crash at any instant leaves
Redis consistent. Batches are pipelined: one Redis round trip per batch.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from dtq_gateway import observe
from dtq_gateway.domain.validation import NewTask
from dtq_gateway.errors import DtqError, NotFound, QueueFull, WrongState
from dtq_gateway.settings import Settings
from dtq_gateway.store import keys
from dtq_gateway.store.audit import append_audit
from dtq_gateway.store.client import Client, is_cluster
from dtq_gateway.store.durability import ReplicaWait
from dtq_gateway.store.errors import ReplicasNotAcked
from dtq_gateway.store.groups import Groups, queue_limit
from dtq_gateway.store.indexes import write_indexes_logged as write_indexes
from dtq_gateway.store.replies import text as as_text
from dtq_gateway.store.scripts import Script, ScriptPipeline, call_each, execute

log = logging.getLogger(__name__)

ENQUEUE = Script("enqueue")
CANCEL = Script("cancel", helpers=("_finished", "_concurrency"), allow_oom=True)
#: Most tasks per enqueue.lua call: bounds how long one script holds Redis (~25 us each).
CHUNK = 100
#: Most calls one debounced enqueue makes while other producers keep moving its
#: debounce record to new tasks (each call learns the record's current task).
DEBOUNCE_TRIES = 8
#: Debounce keys whose burst's task this gateway remembers (oldest forgotten first),
#: so that an enqueue absorbed into a burst it has seen takes one script call, not two.
DEBOUNCE_SEEN = 10_000
#: On a standalone Redis a gateway process asks enqueue.lua to trim the recent-tasks
#: index back to DTQ_RECENT_MAX once it has added more than this many tasks since its
#: last trim (at most 1 % of DTQ_RECENT_MAX; a call of more tasks always trims): one
#: ZREMRANGEBYRANK per 32 unary Enqueues instead of one each. The index then holds at
#: most this many entries more than DTQ_RECENT_MAX per gateway process, plus the tasks
#: of enqueue calls in flight (docs/redis-layout.md).
RECENT_TRIM_SLACK = 31


@dataclass(frozen=True, slots=True)
class Enqueued:
    """Outcome of one enqueue: the (possibly earlier) task id and its status string."""

    task_id: str
    status: str
    deduplicated: bool = False
    queue: str = ""
    #: absorbed by the task's debounce into ``task_id``, the burst's task
    debounced: bool = False


@dataclass(frozen=True, slots=True)
class EnqueueItem:
    """One task's item of enqueue.lua's reply (the script's header gives the shapes).

    Attributes:
        kind: ``ok`` (stored), ``dup`` (its idempotency key names an earlier task),
            ``full`` (the queue is at DTQ_MAX_QUEUE_DEPTH), ``debounced`` (absorbed into
            the burst's task) or ``debounce_retry`` (the debounce record names another
            task than the caller believed: call again believing ``task_id``).
        task_id: the stored task (ok), the earlier task (dup), the burst's task
            (debounced), the record's task (debounce_retry); "" for full.
        status: the task's status (ok, debounced; dup: the earlier one's), else "".
    """

    kind: str
    task_id: str = ""
    status: str = ""


@dataclass(frozen=True, slots=True)
class EnqueueReply:
    """One enqueue.lua call's reply, decoded (:func:`enqueue_reply`).

    Attributes:
        items: one per task of the call, in order.
        became_busy: the call set the queue's busy marker (add it to dtq:queues:busy).
        recent: created task ids and times for the recent-tasks index, as
            (ms, id, ms, id, ...) strings (empty when the call wrote the index).
        trimmed: the call trimmed the recent-tasks index to DTQ_RECENT_MAX.
    """

    items: tuple[EnqueueItem, ...]
    became_busy: bool = False
    recent: tuple[str, ...] = ()
    trimmed: bool = False


def enqueue_reply(raw: list[Any]) -> EnqueueReply:
    """Decode enqueue.lua's reply: its items, then the last ``{'meta', now_ms,
    became_busy, recent, trimmed}`` item."""
    became_busy, recent, trimmed = False, cast(tuple[str, ...], ()), False
    if raw and as_text(raw[-1][0]) == "meta":
        meta = raw[-1]
        raw = raw[:-1]
        became_busy, recent = bool(int(meta[2])), tuple(as_text(v) for v in meta[3])
        trimmed = len(meta) > 4 and int(meta[4]) == 1
    items = tuple(EnqueueItem(as_text(r[0])) if as_text(r[0]) == "full" else
                  EnqueueItem(as_text(r[0]), as_text(r[1]), as_text(r[2]) if len(r) > 2 else "")
                  for r in raw)
    return EnqueueReply(items, became_busy, recent, trimmed)


@dataclass(frozen=True, slots=True)
class CancelReply:
    """cancel.lua's reply: ``kind`` ``cancelled``, ``requested`` (active: flagged),
    ``terminal`` (``status`` says which) or ``missing``."""

    kind: str
    status: str = ""

    @classmethod
    def of(cls, raw: list[Any]) -> CancelReply:
        """Decode cancel.lua's reply (``{kind}`` or ``{'terminal', status}``)."""
        return cls(as_text(raw[0]), as_text(raw[1]) if len(raw) > 1 else "")


class Broker:
    """Enqueue, read and cancel tasks. ``on_queued(queue)`` is called after a task is queued."""

    def __init__(self, redis: Client, settings: Settings, groups: Groups,
                 on_queued: Callable[[str], None] = lambda q: None,
                 read_ahead: Callable[[str, str], Any] | None = None) -> None:
        self.redis = redis
        self.settings = settings
        self.groups = groups
        self.on_queued = on_queued
        #: ``read_ahead(queue, task_type)`` -> a sessions.ReadAhead or None
        #: (Dispatcher.read_ahead)
        self.read_ahead = read_ahead
        #: DTQ_REDIS_MIN_REPLICAS_ACK: enqueues wait for replicas (None = off)
        self.wait = ReplicaWait.of(settings.redis_min_replicas_ack,
                                   settings.redis_replica_ack_timeout_ms)
        #: (queue, debounce digest) -> the task id its record named last time (a hint:
        #: enqueue.lua checks it and answers debounce_retry when it is stale)
        self._debounce_seen: OrderedDict[tuple[str, str], str] = OrderedDict()
        #: a cluster client: the recent-tasks index is in another slot than the queue's
        #: keys, so it is written after the enqueue call (standalone: by the call)
        self._cluster = is_cluster(redis)
        #: standalone Redis: tasks this process's enqueue calls added to the
        #: recent-tasks index since the last reply that says its call trimmed it, and
        #: how many may be added untrimmed
        self._untrimmed = 0
        self._trim_slack = min(RECENT_TRIM_SLACK, settings.recent_max // 100)

    def _trim_due(self, n: int) -> bool:
        """Count ``n`` tasks the call being built adds to the recent-tasks index; True
        when that call must trim it: more than the slack were added since the last
        trimming call came back. Until one does (a failed call never does), every call
        trims."""
        self._untrimmed += n
        return self._untrimmed > self._trim_slack

    def _enqueue_call(self, tasks: list[NewTask], takeover: str = "",
                      believed: str = "") -> tuple[list[str], list]:
        """KEYS and ARGV of one enqueue.lua call for ``tasks``, all of one queue (see the
        script's header). A call without debounced tasks has the layout it always had;
        ``believed`` is the task id a single debounced task's record is thought to name."""
        s = self.settings
        gate = s.max_queue_depth > 0
        deb = any(t.debounce_spec for t in tasks)
        queue = tasks[0].queue
        keys_ = [keys.schedule(queue), keys.busy_marker(queue), keys.expiring(queue)]
        # standalone: the script trims the recent-tasks index only when asked ('' = not)
        trim_to = s.recent_max if self._cluster or self._trim_due(len(tasks)) else ""
        args = Script.argv_notified(len(tasks), int(deb), s.idem_ttl_s,
                                    trim_to, s.max_queue_depth)
        for t in tasks:
            task_key = keys.task(t.task_id)
            third = task_key
            if t.idem_key:
                third = keys.idempotency(t.queue, t.idem_digest)
            elif t.debounce_spec:
                third = keys.debounce(t.queue, t.debounce_digest)
            keys_ += (task_key, keys.stream(t.queue, t.priority), third)
            hint = believed or (self._debounce_seen.get((t.queue, t.debounce_digest), "")
                                if t.debounce_spec else "")
            if deb:
                keys_.append(keys.task(hint) if hint else task_key)
            if gate:
                keys_ += keys.queue_streams_desc(t.queue)
            args += (t.task_id, t.queue, t.task_type, t.payload, t.content_type, t.priority,
                     t.max_attempts, t.timeout_ms, t.idem_key, t.idem_digest, t.metadata_json,
                     t.backoff_base_ms, t.backoff_cap_ms, t.delay_ms, t.not_before_ms,
                     t.expires_at_ms, t.ttl_ms, takeover, t.extra_json, t.concurrency_key,
                     t.labels_json)
            if deb:
                args.append(f"{t.debounce_spec}:{hint}" if t.debounce_spec else "")
        if not self._cluster:  # the script writes the recent-tasks index itself
            keys_.append(keys.RECENT_TASKS)
        return keys_, args

    async def enqueue_many(self, tasks: list[NewTask]) -> list[Enqueued | Exception]:
        """Enqueue validated tasks in one round trip; per-item outcomes.

        The tasks go out as enqueue.lua calls of at most ``CHUNK`` tasks each, pipelined
        (one EVALSHA for a unary Enqueue). Returns one :class:`Enqueued` or exception
        per task, in order: :class:`QueueFull`, or the Redis error of the task's chunk
        (a chunk is one script call: a refusal such as OutOfMemoryError at ``maxmemory``
        refuses it as a whole; a connection error leaves it unknown, stored or not; on a
        cluster only the chunks of the failing node's queues get it). The other chunks'
        outcomes stand. A single task's Redis error is raised, as are connection errors
        of a single call (the servicer maps them to a status).
        """
        refused = await self.groups.ensure_some(self.redis, {t.queue for t in tasks})
        if refused:  # new queue names beyond DTQ_MAX_QUEUES: those items only
            if len(tasks) == 1:
                raise queue_limit(tasks[0].queue, self.groups.max_queues)
            kept = [t for t in tasks if t.queue not in refused]
            outs = await self.enqueue_many(kept) if kept else []
            it = iter(outs)
            return [queue_limit(t.queue, self.groups.max_queues) if t.queue in refused
                    else next(it) for t in tasks]
        if len(tasks) == 1 and self.read_ahead is not None and not tasks[0].delay_ms \
                and not tasks[0].not_before_ms \
                and not tasks[0].debounce_spec.startswith("last"):  # always scheduled
            ahead = self.read_ahead(tasks[0].queue, tasks[0].task_type)
            if ahead is not None:
                return [await self._enqueue_read_ahead(tasks[0], ahead)]
        # one script call per chunk of at most CHUNK tasks of one queue (one hash slot)
        by_queue: dict[str, list[int]] = {}
        for i, t in enumerate(tasks):
            by_queue.setdefault(t.queue, []).append(i)
        parts = [idx[j:j + CHUNK] for idx in by_queue.values()
                 for j in range(0, len(idx), CHUNK)]
        chunks = await call_each(self.redis, ENQUEUE, [
            self._enqueue_call([tasks[i] for i in part]) for part in parts], self.wait)
        for part, chunk in zip(parts, chunks):
            if isinstance(chunk, ReplicasNotAcked):  # queued on the primary all the same
                self.on_queued(tasks[part[0]].queue)
        if len(tasks) == 1 and isinstance(chunks[0], Exception):
            raise chunks[0]  # a unary Enqueue answers the error as its status
        slots: list[Enqueued | Exception | None] = [None] * len(tasks)
        recent: list = []
        busy: list[str] = []
        for part, chunk in zip(parts, chunks):
            if isinstance(chunk, Exception):
                # a chunk is one script call: refused as a whole (Redis refuses a script
                # at its first write), the other chunks' outcomes stand
                for i in part:
                    slots[i] = chunk
                continue
            decoded = enqueue_reply(chunk)
            self._collect_meta(decoded, tasks[part[0]].queue, recent, busy)
            for i, item in zip(part, decoded.items):
                slots[i] = await self._outcome(tasks[i], item, recent, busy)
        await write_indexes(self.redis, recent, busy, self.settings.recent_max)
        out: list[Enqueued | Exception] = [o for o in slots if o is not None]
        fresh = [o.queue for o in out
                 if isinstance(o, Enqueued) and not (o.deduplicated or o.debounced)]
        for q in set(fresh):
            observe.enqueued(q, fresh.count(q))
        for q in {o.queue for o in out if isinstance(o, Enqueued) and o.status == "queued"}:
            self.on_queued(q)
        return out

    async def _enqueue_read_ahead(self, task: NewTask, ahead: Any) -> Enqueued | DtqError:
        """Enqueue one task with a lease_take for an idle session in the same round trip.

        The dispatcher activates what the read returned (and wakes other sessions
        itself when the read came back empty), so ``on_queued`` is not called here.
        """
        pipe = ScriptPipeline(self.redis)
        ENQUEUE.queue(pipe, *self._enqueue_call([task]))
        ahead.queue_calls(pipe)
        try:
            (replies, *read) = await execute(self.redis, pipe, self.wait)
            # not confirmed by enough replicas (DTQ_REDIS_MIN_REPLICAS_ACK), yet applied
            # on the primary: deliver what the read took, then answer the error
            unconfirmed = replies if isinstance(replies, ReplicasNotAcked) else None
            if unconfirmed is not None:
                replies = unconfirmed.reply
                read = [r.reply if isinstance(r, ReplicasNotAcked) else r for r in read]
            if isinstance(replies, Exception):
                raise replies
        except BaseException:
            ahead.cancel()
            raise
        ahead.deliver(read)
        recent: list = []
        busy: list[str] = []
        decoded = enqueue_reply(replies)
        self._collect_meta(decoded, task.queue, recent, busy)
        out = await self._outcome(task, decoded.items[0], recent, busy)
        await write_indexes(self.redis, recent, busy, self.settings.recent_max)
        if isinstance(out, Enqueued) and not (out.deduplicated or out.debounced):
            observe.enqueued(task.queue, 1)
            if decoded.items[0].kind != "ok" and out.status == "queued":
                self.on_queued(task.queue)  # queued by a take-over after the read ran
        if unconfirmed is not None:
            raise unconfirmed
        return out

    def _collect_meta(self, reply: EnqueueReply, queue: str, recent: list,
                      busy: list[str]) -> None:
        """Add what one enqueue.lua call asks of the indexes to the writes still to do
        (and start the count of untrimmed tasks again after a call that trimmed)."""
        if reply.trimmed:
            self._untrimmed = 0
        if reply.became_busy:
            busy.append(queue)
        recent += reply.recent

    async def _outcome(self, task: NewTask, item: EnqueueItem, recent: list,
                       busy: list[str]) -> Enqueued | DtqError:
        kind = item.kind
        if task.debounce_spec and kind in ("ok", "debounced", "debounce_retry"):
            self._remember_debounce(task, task.task_id if kind == "ok" else item.task_id)
        if kind == "ok":
            return Enqueued(task.task_id, item.status, queue=task.queue)
        if kind == "debounced":
            return Enqueued(item.task_id, item.status, queue=task.queue, debounced=True)
        if kind == "debounce_retry":
            return await self._debounce_again(task, item.task_id, recent, busy)
        if kind == "full":
            return QueueFull(f"queue {task.queue!r} is at its depth limit "
                             f"({self.settings.max_queue_depth})", retry_after_ms=1000)
        earlier = item.task_id
        status = await self.redis.hget(keys.task(earlier), "status")
        if status is None:
            # The record points at a task that no longer exists (expired or lost in a
            # Redis failover): let this enqueue take the key over instead of waiting
            # for the record's TTL.
            (chunk,) = await call_each(self.redis, ENQUEUE, [
                self._enqueue_call([task], takeover=earlier)], self.wait)
            if isinstance(chunk, Exception):
                raise chunk
            decoded = enqueue_reply(chunk)
            self._collect_meta(decoded, task.queue, recent, busy)
            return await self._outcome(task, decoded.items[0], recent, busy)
        return Enqueued(earlier, as_text(status), deduplicated=True, queue=task.queue)

    def _remember_debounce(self, task: NewTask, task_id: str) -> None:
        seen = self._debounce_seen
        seen[(task.queue, task.debounce_digest)] = task_id
        seen.move_to_end((task.queue, task.debounce_digest))
        if len(seen) > DEBOUNCE_SEEN:
            seen.popitem(last=False)

    async def _debounce_again(self, task: NewTask, believed: str, recent: list,
                              busy: list[str]) -> Enqueued | DtqError:
        """Call enqueue.lua again for a debounced task whose record names ``believed``
        (a script may touch only the keys it is given, and the burst's task hash is
        known only once the record is read). Raises RuntimeError after
        DEBOUNCE_TRIES calls that each found the record moved on."""
        for _ in range(DEBOUNCE_TRIES):
            (chunk,) = await call_each(self.redis, ENQUEUE, [
                self._enqueue_call([task], believed=believed)], self.wait)
            if isinstance(chunk, Exception):
                raise chunk
            decoded = enqueue_reply(chunk)
            self._collect_meta(decoded, task.queue, recent, busy)
            item = decoded.items[0]
            if item.kind != "debounce_retry":
                return await self._outcome(task, item, recent, busy)
            believed = item.task_id
        raise RuntimeError(f"debounce record of queue {task.queue!r} kept moving")

    async def get(self, task_id: str) -> tuple[dict[bytes, bytes], bytes | None]:
        """The task hash and its stored result (None when absent or expired).

        Raises:
            NotFound: no such task (or its record expired).
        """
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(keys.task(task_id))
        pipe.get(keys.result(task_id))
        fields, result = await pipe.execute()
        if not fields:
            raise NotFound(f"task {task_id} not found", field="task_id")
        return fields, result

    async def cancel(self, task_id: str, actor: str, request_id: str, reason: str) -> str:
        """Cancel a task; returns "cancelled" or "requested" (active task flagged).

        Raises:
            NotFound: unknown task.
            WrongState: the task is already terminal.
        """
        rec = await self.redis.hmget(keys.task(task_id), "queue", "idem_digest", "priority")
        has_idem = bool(rec[0] and rec[1])
        queue, band = as_text(rec[0] or b""), as_text(rec[2] or b"")
        valid = keys.QUEUE_RE.match(queue) and len(band) == 1 and band.isdigit()
        tkey = keys.task(task_id)
        # every key of the queue's slot; without a readable record the task key stands in
        # (the script then answers "missing")
        keys_ = [tkey, keys.cancelled(queue) if valid else tkey,
                 keys.schedule(queue) if valid else tkey,
                 keys.finished(queue) if valid else tkey,
                 keys.idempotency(queue, as_text(rec[1])) if has_idem and valid else tkey,
                 keys.stream(queue, int(band)) if valid else tkey,
                 keys.queue_counters(queue) if valid else tkey]
        raw = await CANCEL(self.redis, keys_, Script.argv(
            task_id, actor, request_id, reason[:1024], self.settings.audit_maxlen,
            self.settings.task_retention_s, "1" if has_idem and valid else "0", keys.GROUP,
            self.settings.keep_finished_for(queue)))
        reply = CancelReply.of(raw)
        kind = reply.kind
        if kind == "missing":
            raise NotFound(f"task {task_id} not found", field="task_id")
        if kind == "terminal":
            raise WrongState(f"task {task_id} is already {reply.status}", reason="TASK_TERMINAL")
        await append_audit(self.redis, actor, "cancel_task", task_id, request_id,
                           reason[:1024], maxlen=self.settings.audit_maxlen)
        log.info("task cancel", extra={"task_id": task_id, "actor": actor,
                                       "request_id": request_id, "outcome": kind})
        if kind == "cancelled" and rec[0]:  # queued or scheduled: it ends here
            observe.outcome(as_text(rec[0]), "cancelled", 0, 0)
        return kind
