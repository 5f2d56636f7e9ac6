"""Ack, Fail and Heartbeat in Redis: the lease-fenced scripts and the worker record.

The leasing layer (``leasing/completion.py``) decodes and checks lease ids; this module
takes the decoded leases (:class:`LeaseRef`) and builds the keys and ARGV of
``ack.lua``, ``fail.lua``, ``heartbeat.lua`` and ``worker_beat.lua`` (their headers list
both). Many items go out as one pipeline, so a batch of acks, failures or heartbeats
costs one Redis round trip.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from dtq_gateway.store import keys
from dtq_gateway.store.client import Client
from dtq_gateway.store.durability import ReplicaWait
from dtq_gateway.store.errors import ReplicasNotAcked
from dtq_gateway.store.indexes import queue_set_add
from dtq_gateway.store.replies import text as as_text
from dtq_gateway.store.scripts import (
    Script,
    ScriptPipeline,
    call_chunks,
    call_each,
    execute,
)

ACK = Script("ack", helpers=("_finished",), allow_oom=True)
FAIL = Script("fail", allow_oom=True)
HEARTBEAT = Script("heartbeat", allow_oom=True)
WORKER_BEAT = Script("worker_beat", allow_oom=True)
#: Most leases per ack.lua call: bounds how long one script holds Redis.
ACK_CHUNK = 100


@dataclass(frozen=True, slots=True)
class LeaseOutcome:
    """What ack.lua or fail.lua did with one lease (:func:`lease_outcome`).

    Attributes:
        kind: ``ok`` (acked), ``retry``, ``dead``, ``released`` or ``cancelled``
            (failed: what became of the task), ``dup`` (a repeat of the call that
            finished the lease: nothing changed) or ``stale`` (the lease is not the
            task's current one: nothing changed).
        status: the task's status the script named (fail.lua's kinds, ``dup``,
            ``stale``; ``missing`` when the record is gone); "" for ``ok``.
        started_at_ms: when the attempt started (Redis TIME, ms); 0 for dup / stale.
        finished_at_ms: when the ack finished the task (ms); 0 for any other kind.
        follow: follow-up work owed, terminal outcomes only (``ok``, ``dead``,
            ``cancelled``): 'c' a chain step, 'g' a group member ended, 'cg' both, ''.
        unparked: the reply's optional sixth item: tasks of the lease's concurrency key
            went back to their band (False when the script sends no such item).
    """

    kind: str
    status: str = ""
    started_at_ms: int = 0
    finished_at_ms: int = 0
    follow: str = ""
    unparked: bool = False


def lease_outcome(reply: Sequence[Any]) -> LeaseOutcome:
    """Decode one ack.lua / fail.lua reply (their headers give the shapes):
    ``{'ok', started_at_ms, created_at_ms, finished_at_ms, follow}``,
    ``{kind, status, started_at_ms, due_at_ms, group}`` or ``{'dup'|'stale', status}``."""
    kind = as_text(reply[0])
    if kind in ("dup", "stale"):
        return LeaseOutcome(kind, as_text(reply[1]))
    follow = as_text(reply[4]) if len(reply) > 4 and kind in ("ok", "dead", "cancelled") else ""
    unparked = len(reply) > 5 and int(reply[5] or 0) > 0
    if kind == "ok":
        return LeaseOutcome(kind, "", int(reply[1]), int(reply[3]), follow, unparked)
    return LeaseOutcome(kind, as_text(reply[1]), int(reply[2]), 0, follow, unparked)


@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    """What one heartbeat did (:func:`heartbeat`).

    Attributes:
        denied: the worker record is bound to another identity: nothing changed.
        states: heartbeat.lua's state per lease, in order: ``ok`` (extended), ``lost``
            (not the current lease, or the reaper claimed the entry), ``overdue`` (past
            started + timeout + grace: no longer extended), ``cancelled`` (extended;
            a cancel was requested); empty when denied.
    """

    denied: bool
    states: tuple[str, ...] = ()


def _outcomes(replies: Sequence[Any]) -> list[LeaseOutcome | Exception]:
    """Each reply decoded; an error stays in its place (a :class:`ReplicasNotAcked`
    carrying the decoded outcome of what the primary applied)."""
    out: list[LeaseOutcome | Exception] = []
    for reply in replies:
        if isinstance(reply, ReplicasNotAcked):
            out.append(ReplicasNotAcked(reply.wanted, reply.got, reply.timeout_ms,
                                        lease_outcome(cast(Sequence[Any], reply.reply))))
        elif isinstance(reply, Exception):
            out.append(reply)
        else:
            out.append(lease_outcome(reply))
    return out


class LeaseRef(Protocol):
    """The fields of a decoded lease id (``leasing.leaseid.Lease``) the scripts need."""

    @property
    def task_id(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def band(self) -> int: ...
    @property
    def entry_id(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def worker_id(self) -> str: ...
    @property
    def idem_digest(self) -> str: ...
    @property
    def tag(self) -> str: ...


@dataclass(frozen=True, slots=True)
class WorkerRegistration:
    """What a Lease session says about its worker (stored in dtq:worker:<id>, shown by
    ListWorkers): free-form labels, its queues and its task type filter (empty = all)."""

    labels: Mapping[str, str]
    queues: Sequence[str]
    task_types: Sequence[str] = ()

    def argv(self) -> tuple[str, str, str, str]:
        """worker_beat.lua ARGV[14..17]."""
        return ("1", json.dumps(dict(sorted(self.labels.items())), separators=(",", ":")),
                ",".join(self.queues), ",".join(sorted(self.task_types)))


@dataclass(frozen=True, slots=True)
class WorkerBeat:
    """One refresh of ``dtq:worker:<id>`` (worker_beat.lua; PEXPIRE ``ttl_ms``).

    ``hostname`` already cut to its limit; ``event``: "" (a heartbeat), "draining",
    "started" or "stopped"; ``active`` / ``concurrency``: "" when not said;
    ``counters``: (tasks processed, failed, retried) when the worker sent them;
    ``gateway_id``: with "started"/"stopped", count the worker's open Lease streams on
    that gateway (ListWorkers' ``leasing``), None for no count; ``owner``: the owner tag
    of the caller (the first beat binds the record to it); ``registration``: with
    "started", the session's labels, queues and task type filter.
    """

    worker_id: str
    hostname: str
    ttl_ms: int
    event: str = ""
    active: int | str = ""
    concurrency: int | str = ""
    counters: tuple[int, int, int] | None = None
    gateway_id: str | None = None
    owner: str = ""
    registration: WorkerRegistration | None = None


def _queue_beat(pipe: Any, b: WorkerBeat) -> None:
    processed, failed, retried = b.counters or (0, 0, 0)
    reg = b.registration.argv() if b.registration else ("0", "", "", "")
    WORKER_BEAT.queue(pipe, [keys.worker(b.worker_id), keys.WORKERS], Script.argv(
        b.worker_id, b.hostname, b.ttl_ms, b.event, b.active, b.concurrency,
        processed, failed, retried, "1" if b.counters is not None else "0",
        keys.gateway_tag(b.gateway_id) if b.gateway_id is not None else "", b.owner, *reg))


def _idem_key(lease: LeaseRef) -> str:
    return keys.idempotency(lease.queue, lease.idem_digest) if lease.idem_digest else \
        keys.task(lease.task_id)


async def worker_beat(redis: Client, beat: WorkerBeat) -> bool:
    """Refresh a worker's record (one round trip).

    Returns:
        False when the record is bound to another identity (nothing changed).

    Raises:
        The call's Redis error.
    """
    pipe = ScriptPipeline(redis)
    _queue_beat(pipe, beat)
    (reply,) = await execute(redis, pipe)
    if isinstance(reply, Exception):
        raise reply
    return reply != b"denied"


async def heartbeat(redis: Client, beat: WorkerBeat,
                    leases: Sequence[tuple[LeaseRef, str, str]], lease_grace_ms: int
                    ) -> HeartbeatReply:
    """The worker record's refresh and one heartbeat.lua call per lease, one pipeline.

    Args:
        leases: (lease, progress percent, progress message) per lease to extend; the
            percent as text ("" = no report), the message already cut to its limit.
        lease_grace_ms: the extension past the worker's next heartbeat.

    Returns:
        heartbeat.lua's state per lease, or ``denied`` when the worker record is bound
        to another identity (the refresh changed nothing; the caller only sends leases
        issued to the caller).

    Raises:
        The first failed call's Redis error.
    """
    pipe = ScriptPipeline(redis)
    _queue_beat(pipe, beat)
    for le, percent, message in leases:
        HEARTBEAT.queue(pipe, [keys.stream(le.queue, le.band), keys.task(le.task_id)],
                        Script.argv(keys.GROUP, le.entry_id, le.attempt, le.worker_id,
                                    lease_grace_ms, le.tag, percent, message, le.task_id))
    replies = await execute(redis, pipe)
    if isinstance(replies[0], Exception):  # the worker record was not refreshed
        raise replies[0]
    if replies[0] == b"denied":
        return HeartbeatReply(denied=True)
    for reply in replies[1:]:
        if isinstance(reply, Exception):
            raise reply
    return HeartbeatReply(False, tuple(as_text(reply) for reply in replies[1:]))


async def ack(redis: Client, parts: Sequence[Sequence[tuple[LeaseRef, bytes]]],
              result_max_bytes: int, result_retention_s: int, task_retention_s: int,
              wait: ReplicaWait | None = None,
              keep_finished: Callable[[str], int] | None = None
              ) -> list[LeaseOutcome | Exception]:
    """ack.lua, one call per part: (lease, result) pairs of one queue (one hash slot),
    at most :data:`ACK_CHUNK` each; one EVALSHA for one part, one pipeline beyond.

    A result longer than ``result_max_bytes`` is stored cut, marked truncated.

    With ``keep_finished`` (queue -> DTQ_KEEP_FINISHED of that queue, e.g.
    ``Settings.keep_finished_for``) each call of a queue whose value is > 0 adds its
    tasks to the queue's finished index and deletes the oldest records beyond that many
    (at most the call's task count + 64 per call; see ``lua/_finished.lua``).

    With ``wait`` (DTQ_REDIS_MIN_REPLICAS_ACK) each call is followed by WAIT; a call
    fewer replicas confirmed is returned as :class:`ReplicasNotAcked` per lease of it,
    carrying that lease's ack.lua reply (the primary applied it).

    Returns:
        ack.lua's outcome per lease, in the order of the parts (a ReplicasNotAcked
        carrying it where replicas did not confirm).

    Raises:
        The first failed call's Redis error (other than ReplicasNotAcked).
    """
    calls = []
    for part in parts:
        keys_: list[str] = []
        keep = keep_finished(part[0][0].queue) if keep_finished and part else 0
        args = Script.argv_notified(keys.GROUP, len(part), result_retention_s,
                                    task_retention_s, keep)
        for le, raw in part:
            result = raw[:result_max_bytes]
            keys_ += (keys.stream(le.queue, le.band), keys.task(le.task_id),
                      keys.result(le.task_id), _idem_key(le), keys.chain_pending(le.queue),
                      keys.queue_counters(le.queue))
            args += (le.entry_id, le.attempt, le.worker_id, le.task_id, result,
                     "1" if len(raw) > len(result) else "0", le.tag)
        if keep > 0:
            keys_.append(keys.finished(part[0][0].queue))
        calls.append((keys_, args))
    if wait is None:
        return _outcomes(await call_chunks(redis, ACK, calls))
    items: list = []
    for reply in await call_each(redis, ACK, calls, wait):
        if isinstance(reply, ReplicasNotAcked):
            items += [ReplicasNotAcked(reply.wanted, reply.got, reply.timeout_ms, one)
                      for one in cast(list[Any], reply.reply)]
        elif isinstance(reply, Exception):
            raise reply
        else:
            items += reply
    return _outcomes(items)


async def fail(redis: Client, items: Sequence[tuple[LeaseRef, str, bool, int, str, str]],
               dlq_maxlen: int, task_retention_s: int,
               wait: ReplicaWait | None = None) -> list[LeaseOutcome | Exception]:
    """fail.lua once per item, all in one pipeline (one round trip).

    The pipeline first adds the items' queues to the dead-letter index (it spans queues:
    a single-key SADD ahead of the per-queue scripts; a member without entries is
    harmless), since any call may dead-letter.

    Args:
        items: (lease, mode: failure / release / cancelled, retryable, retry_after_ms
            (0 = the backoff), error message, error class) per lease; the strings
            already cut to their limits.
        dlq_maxlen: MAXLEN of the dead-letter stream.
        task_retention_s: TTL of the records of tasks that end here.

        wait: DTQ_REDIS_MIN_REPLICAS_ACK's WAIT after the calls (None = off); an item
            fewer replicas confirmed gets :class:`ReplicasNotAcked` carrying its reply.

    Returns:
        fail.lua's outcome per item, in order, a failed call's error in its place.
    """
    if not items:
        return []
    pipe = ScriptPipeline(redis)
    queue_set_add(pipe, keys.DEAD_LETTER_QUEUES, {it[0].queue for it in items})
    for le, mode, retryable, retry_after_ms, message, error_class in items:
        FAIL.queue(pipe, [keys.stream(le.queue, le.band), keys.task(le.task_id),
                          keys.dead_letter(le.queue), keys.schedule(le.queue), _idem_key(le),
                          keys.queue_counters(le.queue)],
                   Script.argv_notified(
                       keys.GROUP, le.entry_id, le.attempt, le.worker_id, le.task_id, mode,
                       "1" if retryable else "0", retry_after_ms, random.random(), message,
                       error_class, dlq_maxlen, task_retention_s,
                       "1" if le.idem_digest else "0", le.tag))
    return _outcomes((await execute(redis, pipe, wait))[1:])
