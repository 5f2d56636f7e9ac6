"""Lease dispatching in Redis: worker_check, lease_take, activate, worker_states, and
the deployment's lease-id secret.

The dispatcher (``leasing/dispatch.py``) decides which session reads, with what credit
and when; this module knows the keys and ARGV of each script (their headers in ``lua/``
list them), sends the calls with the pipelining the dispatcher's round trips are
counted in, and decodes every reply into the typed values of
:mod:`dtq_gateway.store.lease_replies`. On a standalone or Sentinel-managed Redis a
session's lease_take checks its worker itself (``lease_take_call(check_ms=...)``: one
script call per read); on a cluster the worker's record is in another slot, so a
session's worker_check and lease_takes go out as one pipeline (:func:`check_and_take`,
or :func:`queue_check_and_take` behind an enqueue): one round trip reads and
activates. Entries lease_take leaves unactivated
(queues with task-type rate limits: their tokens are taken between the read and the
activation) go through :func:`activate`, one call per queue in one pipeline.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from dtq_gateway.store import keys
from dtq_gateway.store.client import Client
from dtq_gateway.store.lease_replies import (
    Activation,
    LeaseRead,
    ReadEntry,
    WorkerState,
    decode_read,
)
from dtq_gateway.store.replies import text as as_text
from dtq_gateway.store.scripts import (
    EVENT_ID_PREFIX,
    Script,
    ScriptPipeline,
    call_each,
    execute,
)

LEASE_TAKE = Script("lease_take", helpers=("_worker_state", "_bucket", "_lease_read",
                                           "_finished", "_concurrency", "_activate"),
                    allow_oom=True)
WORKER_CHECK = Script("worker_check", helpers=("_worker_state",))
ACTIVATE = Script("activate", helpers=("_finished", "_concurrency", "_activate"),
                  allow_oom=True)
WORKER_STATES = Script("worker_states")

#: KEYS and ARGV of one script call.
Call = tuple[list[str], list[Any]]

#: Marks a pub/sub message (one per script call, see events_wire.py) of a call this
#: process made with ``Script.argv_notified`` (lease_take, activate, ack, fail): the
#: caller already woke its dispatcher directly.
OWN_EVENT = b'"id_prefix":"' + EVENT_ID_PREFIX.encode()


@dataclass(frozen=True, eq=False)
class SlotRead:
    """The queues of a session that share one hash slot, read by one lease_take call.

    ``streams``: their band streams, band-major (p9 of every queue first), and
    ``where``: the queue and band of each. ``turn``: the read counter that picks the
    queue each band is read from first (round robin across the queues,
    docs/fairness.md); shared with the slot read's :meth:`band` reads.
    """

    queues: list[str]
    streams: list[str]
    where: list[tuple[str, int]]
    turn: Iterator[int] = field(default_factory=itertools.count, compare=False, repr=False)

    @classmethod
    def of(cls, queues: list[str]) -> SlotRead:
        """Every band of ``queues``."""
        pairs = [(q, b) for b in keys.BANDS_DESC for q in queues]
        return cls(queues, [keys.stream(q, b) for q, b in pairs], pairs)

    def band(self, band: int) -> SlotRead:
        """The same queues restricted to one band."""
        pairs = [(q, band) for q in self.queues]
        return SlotRead(self.queues, [keys.stream(q, b) for q, b in pairs], pairs,
                        self.turn)

    @property
    def take_keys(self) -> list[str]:
        """lease_take's KEYS: pause flags, rate-limit hashes, cancelled sets, expiry
        indexes, band streams."""
        qs = self.queues
        return ([keys.paused(q) for q in qs] + [keys.rate_limit(q) for q in qs]
                + [keys.cancelled(q) for q in qs] + [keys.expiring(q) for q in qs]
                + self.streams)

    def decode(self, reply: list[Any], peek: bool = False) -> LeaseRead:
        """This read's lease_take reply as a :class:`LeaseRead`."""
        return decode_read(reply, self.queues, self.streams, self.where, peek)


@dataclass(frozen=True, slots=True)
class Layout:
    """What a Lease session reads: ``streams`` (band streams, band-major, p9 first),
    ``slot_reads`` (its queues by hash slot, one lease_take call each; a single-queue
    session has one) and ``where`` (queue and band of each of ``streams``)."""

    streams: list[str]
    slot_reads: list[SlotRead]
    where: dict[str, tuple[str, int]] = field(default_factory=dict)


def session_layout(queues: list[str], by_slot: bool = True) -> Layout:
    """The :class:`Layout` of a session reading ``queues``.

    ``by_slot``: one slot read per hash slot, as Redis Cluster requires (a script's
    keys must share a slot). False puts every queue in one slot read, so one lease_take
    reads them all: right on a standalone or Sentinel-managed Redis, which never checks
    slots, and one call instead of a peek per queue and a read per (band, queue) holding
    entries (``bench.scale --queues 24``: docs/performance.md).
    """
    streams = [keys.stream(q, b) for b in keys.BANDS_DESC for q in queues]
    where = dict(zip(streams, [(q, b) for b in keys.BANDS_DESC for q in queues]))
    by_slot_queues: dict[int, list[str]] = {}
    for q in queues:
        by_slot_queues.setdefault(keys.key_slot(keys.stream(q, 0)) if by_slot else 0,
                                  []).append(q)
    return Layout(streams, [SlotRead.of(qs) for qs in by_slot_queues.values()], where)


def worker_check_call(worker_id: str, stale_after_ms: int) -> Call:
    """KEYS and ARGV of worker_check.lua for ``worker_id`` (``stale_after_ms``: a
    heartbeat older than this stalls the worker)."""
    return [keys.worker(worker_id)], Script.argv(stale_after_ms)


@dataclass(frozen=True, slots=True)
class TakeArgs:
    """Who a lease_take reads for: the consumer (worker id), its max_in_flight (leases,
    >= 1), the task types it takes (empty: every type), the TTL of records of tasks
    that expire in the call (s) and the session's labels (a task whose required labels
    they lack is put back; docs/fairness.md)."""

    worker_id: str
    max_in_flight: int
    task_types: frozenset[str]
    task_retention_s: int
    labels: tuple[tuple[str, str], ...] = ()


def lease_take_call(read: SlotRead, who: TakeArgs, most: int,
                    max_in_flight: int | None = None, scan_max: int | None = None,
                    check_ms: int | None = None) -> Call:
    """KEYS and ARGV of lease_take.lua for one slot read (``most``: entries this call
    may read, 0 = peek: count pending, report the non-empty streams; ``max_in_flight``
    overrides ``who``'s, for a read of one band after a peek; ``scan_max``: most
    entries the call reads in all, >= 1, None = the script's SCAN_MAX, 256).

    ``check_ms``: run worker_check.lua's check of ``who``'s worker record in the same
    call, with this stale threshold (ms; 0 = draining only): a stalled or draining
    worker gets nothing and the reply says so (:attr:`LeaseRead.worker_state`). Only
    on a standalone or Sentinel-managed Redis: the record is in the ``{workers}`` slot.
    None (default): no check, the state reads OK."""
    types = sorted(who.task_types)
    m = len(read.queues)
    turn = next(read.turn) % m if most and m > 1 else 0
    keys_ = read.take_keys
    tail: tuple[Any, ...] = () if scan_max is None else (scan_max,)
    if check_ms is not None:
        keys_ = [*keys_, keys.worker(who.worker_id)]
        tail = ("" if scan_max is None else scan_max, check_ms)
    return keys_, Script.argv_notified(
        keys.GROUP, who.worker_id, who.max_in_flight if max_in_flight is None
        else max_in_flight, most, m, who.task_retention_s, keys.PREFIX,
        len(types), *types, *read.queues,
        json.dumps(dict(who.labels), separators=(",", ":")) if who.labels else "", turn,
        *tail)


def queue_check_and_take(pipe: ScriptPipeline, check: Call | None, take: Call) -> int:
    """Add a worker_check (None: none, ``take`` checks the worker itself, see
    :func:`lease_take_call`'s ``check_ms``) and a lease_take to ``pipe``; returns how
    many calls were added (2, or 1 without a check). Decode their replies with
    :func:`decode_check_and_take`."""
    if check is not None:
        WORKER_CHECK.queue(pipe, *check)
    LEASE_TAKE.queue(pipe, *take)
    return 1 if check is None else 2


def decode_check_and_take(read: SlotRead, replies: list[Any]) -> LeaseRead:
    """The :class:`LeaseRead` of :func:`queue_check_and_take`'s replies: (check, take),
    or (take,) when the take checked the worker itself.

    Raises:
        The first call's Redis error, if any.
    """
    for r in replies:
        if isinstance(r, BaseException):
            raise r
    if len(replies) == 1:
        return read.decode(replies[0])
    check, take = replies
    return read.decode(take).with_state(WorkerState(int(check)))


async def check_and_take(redis: Client, check: Call, takes: list[tuple[SlotRead, Call]],
                         peek: bool = False) -> tuple[WorkerState, list[LeaseRead]]:
    """A worker_check and lease_takes of one session in one pipeline (one round trip).

    Args:
        check: :func:`worker_check_call`'s.
        takes: per slot read, :func:`lease_take_call`'s (all peeks when ``peek``).

    Returns:
        (the worker's state, one decoded read per take, in order).

    Raises:
        The first call's Redis error, if any.
    """
    pipe = ScriptPipeline(redis)
    WORKER_CHECK.queue(pipe, *check)
    for _, call in takes:
        LEASE_TAKE.queue(pipe, *call)
    state, *replies = await execute(redis, pipe)
    for r in (state, *replies):
        if isinstance(r, Exception):
            raise r
    return WorkerState(int(state)), [read.decode(reply, peek) for (read, _), reply
                                     in zip(takes, replies)]


async def lease_take(redis: Client, read: SlotRead, call: Call) -> LeaseRead:
    """One lease_take call (one round trip), decoded (with the worker's state when
    ``call`` checks it: :func:`lease_take_call`'s ``check_ms``)."""
    return read.decode(await LEASE_TAKE(redis, *call))


async def workers_heard(redis: Client, asks: list[tuple[str, int]]) -> list[bool]:
    """Whether each worker heartbeated recently, through any replica (worker_check).

    Args:
        asks: (worker id, within ms >= 1): did its last heartbeat arrive less than this
            long ago?

    Returns:
        Per ask, in order: True when it did; False when it did not, when the worker is
        draining, or when the check failed. One call, or one pipeline.
    """
    if not asks:
        return []
    replies = await call_each(redis, WORKER_CHECK,
                              [worker_check_call(w, max(1, ms)) for w, ms in asks])
    return [not isinstance(r, Exception) and int(r) == 0 for r in replies]


class PendingLease(NamedTuple):
    """A leased entry pending in its consumer group's PEL: the consumer (worker id)
    holding it and the ms since its last delivery or heartbeat XCLAIM."""

    consumer: str
    idle_ms: int


async def leases_pending(redis: Client, entries: list[tuple[str, int, str]]
                         ) -> list[PendingLease | None]:
    """Where each leased entry stands in its consumer group's PEL, for stream health.

    Args:
        entries: (queue, band 0..9, stream entry id) of each lease.

    Returns:
        Per entry, in order: its :class:`PendingLease` while it is pending, or None
        when it is not (acked, failed,
        released, or its task is gone). One pipeline: one XPENDING per entry.
    """
    if not entries:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for queue, band, entry_id in entries:
            pipe.xpending_range(keys.stream(queue, band), keys.GROUP, min=entry_id,
                                max=entry_id, count=1)
        replies = await pipe.execute(raise_on_error=False)
    out: list[PendingLease | None] = []
    for reply in replies:
        if isinstance(reply, Exception) or not reply:
            # a missing stream or group (queue deleted) holds no lease either
            out.append(None)
            continue
        first = reply[0]
        out.append(PendingLease(as_text(first["consumer"]),
                                int(first["time_since_delivered"])))
    return out


async def worker_states(redis: Client, worker_ids: list[str]) -> list[str]:
    """The status field of each worker's record ("" when it has none), in order; one
    worker_states call (one round trip, keep ``worker_ids`` to about 1,000)."""
    states = await WORKER_STATES(redis, [keys.worker(w) for w in worker_ids], Script.argv())
    return [as_text(s) for s in states]


async def activate(redis: Client, worker_id: str, task_retention_s: int,
                   entries: list[ReadEntry], modes: list[str]) -> list[ReadEntry]:
    """activate.lua for entries a lease_take left unactivated (or to put entries back):
    one call per queue (one hash slot each), one pipeline (one EVALSHA for one queue).

    Args:
        worker_id: the consumer the entries were read for.
        task_retention_s: TTL of the records of tasks that end here (expired), s.
        entries: the entries, as read.
        modes: per entry, ``a`` (activate: lease it, or park it when its concurrency
            key is at its limit) or ``r`` (put it back at the tail of its band, still
            queued, keeping the time it began to wait).

    Returns:
        The entries, in order, each with its :class:`Activation`.

    Raises:
        The first failed call's Redis error; ValueError for a reply of unknown kind.
    """
    calls: dict[str, tuple[list[str], list]] = {}
    where: list[tuple[str, int]] = []
    for e, mode in zip(entries, modes):
        digest = entry_idem_digest(e.fields)
        keys_, args = calls.setdefault(e.queue, ([keys.cancelled(e.queue)], []))
        keys_ += [e.stream, keys.task(e.task_id),
                  keys.idempotency(e.queue, digest) if digest else keys.task(e.task_id)]
        args += [e.entry_id, e.task_id, e.attempt, mode, e.queued_at_ms]
        where.append((e.queue, len(args) // 5 - 1))
    names = list(calls)
    # argv_notified: the dispatcher needs none of its own activation events back
    per_queue = dict(zip(names, await call_each(redis, ACTIVATE, [
        ([*calls[q][0], keys.expiring(q)],
         Script.argv_notified(worker_id, task_retention_s, keys.GROUP, *calls[q][1]))
        for q in names])))
    for rep in per_queue.values():
        if isinstance(rep, Exception):
            raise rep
    return [e.activated(Activation.decode(per_queue[queue][i]))
            for e, (queue, i) in zip(entries, where)]


def entry_idem_digest(fields: dict) -> str:
    """The idempotency digest of a band stream entry's task ("" without a key): the
    entry's ``idem_digest`` field (written since internal keys are hashed apart:
    :func:`keys.internal_idempotency_digest`), else, for an entry written before, the
    client digest of its ``idempotency_key`` text. ``fields`` maps str names to str or
    bytes values."""
    def get(name: str) -> str:
        raw = fields.get(name) or fields.get(name.encode()) or ""
        return raw.decode() if isinstance(raw, bytes) else raw

    idem = get("idempotency_key")
    if not idem:
        return ""
    return get("idem_digest") or keys.idempotency_digest(idem)


async def load_lease_secret(redis: Client, candidate: str) -> bytes | None:
    """The deployment's lease secret (``dtq:secret:lease``), stored as ``candidate`` by
    the first replica that asks (GET; when missing SET NX, then GET again: one round
    trip once stored, three the first time; once per process). Reading first lets a
    gateway that starts while Redis is full (every SET refused) load a stored secret.

    Returns:
        The stored secret, or None when the key is empty.

    Raises:
        Redis errors: Redis unreachable, or full before any secret was stored (the
        caller retries later).
    """
    stored = await redis.get(keys.LEASE_SECRET)
    if stored is None:
        await redis.set(keys.LEASE_SECRET, candidate, nx=True)
        stored = await redis.get(keys.LEASE_SECRET)
    if not stored:
        return None
    return stored if isinstance(stored, bytes) else stored.encode()
