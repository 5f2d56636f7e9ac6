"""Lease dispatching in Redis: worker_check, lease_read, activate, worker_states, and
the deployment's lease-id secret.

The dispatcher (``leasing/dispatch.py``) decides which session reads, with what credit
and when; this module knows the keys and ARGV of each script (their headers in ``lua/``
list them) and sends the calls with the pipelining the dispatcher's round trips are
counted in: a session's worker_check and lease_reads go out as one pipeline
(:func:`check_and_read`, or :func:`queue_check_and_read` behind an enqueue), an
activation batch as one pipeline of one activate call per queue (:func:`activate`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from dtq_gateway.store import keys
from dtq_gateway.store.client import Client
from dtq_gateway.store.replies import text as _s
from dtq_gateway.store.scripts import EVENT_ID_PREFIX, Script, call_each, execute

LEASE_READ = Script("lease_read", helpers=("_bucket",), allow_oom=True)
WORKER_CHECK = Script("worker_check")
ACTIVATE = Script("activate", helpers=("_finished", "_concurrency"), allow_oom=True)
WORKER_STATES = Script("worker_states")

#: KEYS and ARGV of one script call.
Call = tuple[list[str], list[Any]]

#: Marks a pub/sub message (one per script call, see events_wire.py) of a call this
#: process made with ``Script.argv_notified`` (activate, ack, fail): the caller already
#: woke its dispatcher directly.
OWN_EVENT = b'"id_prefix":"' + EVENT_ID_PREFIX.encode()


@dataclass(eq=False)
class ReadGroup:
    """The queues of a session that share one hash slot, read by one lease_read call.

    ``keys``: lease_read's KEYS (pause flags, rate-limit hashes, then the band streams
    band-major); ``index[i]``: the 1-based position in the session's streams of the
    group's stream i+1. ``turn``: the group's read counter, the queue that lease_read
    reads first within each band (round robin across the group's queues,
    docs/fairness.md); shared by the group's :meth:`band` groups.
    """

    queues: list[str]
    keys: list[str]
    index: list[int]
    turn: Iterator[int] = field(default_factory=itertools.count, compare=False, repr=False)

    def band(self, band: int) -> ReadGroup:
        """The group restricted to one band: its pause flags and rate limits, and the
        band's stream of each queue."""
        m = len(self.queues)
        first = (9 - band) * m  # the group's streams of this band, band-major
        return ReadGroup(self.queues,
                         self.keys[:2 * m] + self.keys[2 * m + first:2 * m + first + m],
                         self.index[first:first + m], self.turn)


@dataclass(frozen=True, slots=True)
class Layout:
    """What a Lease session reads: ``streams`` (band streams, band-major, p9 first),
    ``groups`` (its queues by hash slot, one lease_read call each; a single-queue
    session has one) and ``where`` (queue and band of each of ``streams``)."""

    streams: list[str]
    groups: list[ReadGroup]
    where: dict[str, tuple[str, int]]


def session_layout(queues: list[str], by_slot: bool = True) -> Layout:
    """The :class:`Layout` of a session reading ``queues``.

    ``by_slot``: one read group per hash slot, as Redis Cluster requires (a script's
    keys must share a slot). False puts every queue in one group, so one lease_read
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
    position = {s: i + 1 for i, s in enumerate(streams)}
    groups = []
    for qs in by_slot_queues.values():
        group_streams = [keys.stream(q, b) for b in keys.BANDS_DESC for q in qs]
        groups.append(ReadGroup(
            qs, [keys.paused(q) for q in qs] + [keys.rate_limit(q) for q in qs] + group_streams,
            [position[s] for s in group_streams]))
    return Layout(streams, groups, where)


def worker_check_call(worker_id: str, stale_after_ms: int) -> Call:
    """KEYS and ARGV of worker_check.lua for ``worker_id`` (``stale_after_ms``: a
    heartbeat older than this stalls the worker)."""
    return [keys.worker(worker_id)], Script.argv(stale_after_ms)


def lease_read_call(group: ReadGroup, worker_id: str, max_in_flight: int, most: int) -> Call:
    """KEYS and ARGV of lease_read.lua for one slot group (``most``: entries this call
    may read, 0 = peek: count pending, report the non-empty streams). A read (most > 0)
    starts each band at the group's next queue in turn."""
    m = len(group.queues)
    start = next(group.turn) % m if most and m > 1 else 0
    return group.keys, Script.argv(keys.GROUP, worker_id, max_in_flight, most, m, start)


def queue_check_and_read(pipe: Any, check: Call, read: Call) -> int:
    """Add a worker_check and a lease_read to ``pipe`` (a pipeline run by
    ``scripts.execute``); returns how many calls were added (2)."""
    WORKER_CHECK.queue(pipe, *check)
    LEASE_READ.queue(pipe, *read)
    return 2


async def check_and_read(redis: Client, check: Call, reads: list[Call]) -> tuple[int, list]:
    """A worker_check and lease_reads of one session in one pipeline (one round trip).

    Returns:
        (worker state: 0 ok, 1 stalled, 2 draining; one lease_read reply per read).

    Raises:
        The first call's Redis error, if any.
    """
    pipe = redis.pipeline(transaction=False)
    WORKER_CHECK.queue(pipe, *check)
    for read in reads:
        LEASE_READ.queue(pipe, *read)
    state, *replies = await execute(redis, pipe)
    for r in (state, *replies):
        if isinstance(r, Exception):
            raise r
    return int(state), replies


async def lease_read(redis: Client, read: Call) -> list:
    """One lease_read call (one round trip); its reply as lease_read.lua gives it."""
    return await LEASE_READ(redis, *read)


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


async def leases_pending(redis: Client, entries: list[tuple[str, int, str]]
                         ) -> list[tuple[str, int] | None]:
    """Where each leased entry stands in its consumer group's PEL, for stream health.

    Args:
        entries: (queue, band 0..9, stream entry id) of each lease.

    Returns:
        Per entry, in order: (consumer worker id, idle ms since its last delivery or
        heartbeat XCLAIM) while it is pending, or None when it is not (acked, failed,
        released, or its task is gone). One pipeline: one XPENDING per entry.
    """
    if not entries:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for queue, band, entry_id in entries:
            pipe.xpending_range(keys.stream(queue, band), keys.GROUP, min=entry_id,
                                max=entry_id, count=1)
        replies = await pipe.execute(raise_on_error=False)
    out: list[tuple[str, int] | None] = []
    for reply in replies:
        if isinstance(reply, Exception) or not reply:
            # a missing stream or group (queue deleted) holds no lease either
            out.append(None)
            continue
        first = reply[0]
        out.append((_s(first["consumer"]), int(first["time_since_delivered"])))
    return out


async def worker_states(redis: Client, worker_ids: list[str]) -> list[str]:
    """The status field of each worker's record ("" when it has none), in order; one
    worker_states call (one round trip, keep ``worker_ids`` to about 1,000)."""
    states = await WORKER_STATES(redis, [keys.worker(w) for w in worker_ids], Script.argv())
    return [_s(s) for s in states]


async def activate(redis: Client, worker_id: str, task_retention_s: int,
                   entries: list[tuple[str, str, dict]], modes: list[str]
                   ) -> tuple[list[list], list[str]]:
    """activate.lua for entries a lease_read returned: one call per queue (one hash
    slot each), one pipeline (one EVALSHA when there is one queue).

    Args:
        worker_id: the consumer the entries were read for.
        task_retention_s: TTL of the records of tasks that end here (expired).
        entries: (band stream key, entry id, fields by str name with bytes values).
        modes: per entry, ``a`` (activate: lease it, or park it when its concurrency
            key is at its limit) or ``r`` (put it back at the tail of its band, still
            queued, keeping the time it began to wait).

    Returns:
        (activate.lua's reply per entry, in order; the idempotency digest per entry,
        "" for a task without an idempotency key).

    Raises:
        The first failed call's Redis error.
    """
    calls: dict[str, tuple[list[str], list]] = {}
    digests: list[str] = []
    where: list[tuple[str, int]] = []
    for (stream, entry_id, f), mode in zip(entries, modes):
        task_id, queue = _s(f["task_id"]), _s(f["queue"])
        digest = entry_idem_digest(f)
        keys_, args = calls.setdefault(queue, ([keys.cancelled(queue)], []))
        keys_ += [stream, keys.task(task_id),
                  keys.idempotency(queue, digest) if digest else keys.task(task_id)]
        args += [entry_id, task_id, _s(f["attempt"]), mode, queued_at_ms(entry_id, f)]
        digests.append(digest)
        where.append((queue, len(args) // 5 - 1))
    # argv_notified: the dispatcher needs none of its own activation events back
    names = list(calls)
    per_queue = await call_each(redis, ACTIVATE, [
        ([*calls[q][0], keys.expiring(q)], Script.argv_notified(worker_id, task_retention_s, keys.GROUP,
                                           *calls[q][1])) for q in names])
    by_queue = {}
    for q, rep in zip(names, per_queue):
        if isinstance(rep, Exception):
            raise rep
        by_queue[q] = rep
    return [by_queue[queue][i] for queue, i in where], digests


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


def queued_at_ms(entry_id: str, fields: dict) -> int:
    """Epoch ms a band stream entry's task began to wait: its ``queued_at`` field (an
    entry put back unleased keeps the first one), else the time in its id."""
    raw = fields.get("queued_at") or fields.get(b"queued_at")
    return int(raw) if raw else int(entry_id.split("-", 1)[0])


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
