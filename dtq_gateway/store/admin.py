"""Admin domain logic: queue statistics and pause/resume.

Dead-letter operations live in :mod:`dtq_gateway.store.admin_dlq`, the helpers every
admin module shares (Redis TIME, reply integers, page tokens, :class:`CallInfo`) in
:mod:`dtq_gateway.store.admin_common`, which imports no admin module. Everything here reads
"now" from Redis TIME (one clock for every replica, see docs/design.md) and returns
plain dataclasses; ``admin_servicer`` converts them to protobuf.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from dtq_gateway.errors import NotFound
from dtq_gateway.store import keys
from dtq_gateway.store.admin_common import (
    CallInfo,
    as_int,
    entry_ms,
    redis_now_ms,
    validate_queue,
    validate_queue_page_token,
)
from dtq_gateway.store.admin_dlq import dead_letter_depth
from dtq_gateway.store.admin_scripts import PAUSE_QUEUE, QUEUE_SUMMARIES
from dtq_gateway.store.admin_waiting import TypeWaiting, queue_counters, waiting_by_type
from dtq_gateway.store.audit import append_audit
from dtq_gateway.store.client import Client
from dtq_gateway.store.replies import text
from dtq_gateway.store.scripts import call_chunks

#: Most members of dtq:retry:schedule examined to count one queue's scheduled tasks.
SCHEDULE_SCAN_MAX = 10000
_CHUNK = 500


@dataclass(slots=True)
class BandInfo:
    """One band stream: depth, pending, and the first not-yet-delivered entry."""

    band: int
    depth: int = 0
    pending: int = 0
    exists: bool = False
    oldest_undelivered_ms: int = 0  # epoch ms the oldest undelivered task began to wait; 0 = none


@dataclass(slots=True)
class ConsumerInfo:
    """A consumer aggregated across the bands of one queue."""

    name: str
    pending: int = 0
    idle_ms: int = 0


@dataclass(slots=True)
class QueueStats:
    """Statistics of one queue (GetQueueStats)."""

    queue: str
    bands: list[BandInfo]
    scheduled: int = 0
    oldest_task_age_ms: int = 0
    paused: bool = False
    dead_letter_depth: int = 0
    consumers: list[ConsumerInfo] = field(default_factory=list)
    #: dtq:queue:{<q>}:counters (succeeded, retried, dead_lettered, cancelled)
    counters: dict[str, int] = field(default_factory=dict)
    waiting_types: list[TypeWaiting] = field(default_factory=list)
    waiting_complete: bool = True
    now_ms: int = 0

    @property
    def failed(self) -> int:
        """Failed attempts: retried + dead-lettered."""
        return self.counters.get("retried", 0) + self.counters.get("dead_lettered", 0)

    @property
    def stuck_task_types(self) -> list[str]:
        """Types of waiting tasks no live worker of the queue takes, sorted."""
        return sorted(t.task_type for t in self.waiting_types if not t.taken)

    @property
    def depth(self) -> int:
        """Sum of band depths (entries)."""
        return sum(b.depth for b in self.bands)

    @property
    def pending(self) -> int:
        """Sum of band pending counts (entries)."""
        return sum(b.pending for b in self.bands)


@dataclass(frozen=True, slots=True)
class QueueSummary:
    """Headline numbers of one queue (ListQueues)."""

    name: str
    depth: int
    pending: int
    paused: bool


async def busy_queues(redis: Client) -> list[str]:
    """Members of ``dtq:queues:busy`` (queues whose streams may hold entries), sorted."""
    found = {text(m) async for m in redis.sscan_iter(keys.BUSY_QUEUES, count=1000)}
    return sorted(q for q in found if keys.QUEUE_RE.match(q))


async def unregistered(redis: Client, queues: list[str]) -> list[str]:
    """The names among ``queues`` that the queue registry ``dtq:queues`` does not hold
    (deleted, or never created), in order: one ZMSCORE per 500 names."""
    missing: list[str] = []
    for start in range(0, len(queues), _CHUNK):
        chunk = queues[start:start + _CHUNK]
        scores = await redis.zmscore(keys.QUEUES, chunk)
        missing += [q for q, score in zip(chunk, scores) if score is None]
    return missing


async def queue_depths(redis: Client, queues: list[str]) -> dict[str, int]:
    """Sum of the band XLENs of each queue (10 XLEN per queue, pipelined in chunks)."""
    depths: dict[str, int] = {}
    for start in range(0, len(queues), _CHUNK // 10):
        chunk = queues[start:start + _CHUNK // 10]
        async with redis.pipeline(transaction=False) as pipe:
            for q in chunk:
                for stream in keys.queue_streams_desc(q):
                    pipe.xlen(stream)
            lengths = await pipe.execute()
        for i, q in enumerate(chunk):
            depths[q] = sum(lengths[10 * i:10 * i + 10])
    return depths


async def outcome_counts_many(redis: Client, queues: list[str]) -> list[tuple[int, int, int]]:
    """(succeeded, retried, dead_lettered) of each queue's outcome counters
    (``dtq:queue:{<q>}:counters``; absent = 0), in the order of ``queues``: one HMGET
    per queue, one pipeline."""
    async with redis.pipeline(transaction=False) as pipe:
        for queue in queues:
            pipe.hmget(keys.queue_counters(queue), "succeeded", "retried", "dead_lettered")
        rows = await pipe.execute()
    return [(as_int(ok), as_int(retried), as_int(dead)) for ok, retried, dead in rows]


def _group_of(groups: Any) -> dict[str, Any] | None:
    if isinstance(groups, Exception):
        return None
    for g in groups or ():
        if text(g.get("name")) == keys.GROUP:
            return g
    return None


async def band_infos(redis: Client, queue: str) -> list[BandInfo]:
    """Depth, pending and oldest undelivered task of each band, p9 first.

    The undelivered entries are those after the group's last-delivered-id; a band
    without the consumer group counts every entry as undelivered. Of them the first
    and the last one are read (XRANGE / XREVRANGE COUNT 1): an entry put back unleased
    (its type wanted by no session that read it) goes to the tail and keeps its
    ``queued_at``, so a task no worker takes shows its real age.
    """
    return (await band_infos_many(redis, [queue]))[queue]


async def band_infos_many(redis: Client, queues: list[str]) -> dict[str, list[BandInfo]]:
    """:func:`band_infos` of several queues: two pipelines per chunk of queues."""
    out: dict[str, list[BandInfo]] = {}
    step = _CHUNK // 20
    for i in range(0, len(queues), step):
        out.update(await _band_infos_chunk(redis, queues[i:i + step]))
    return out


async def _band_infos_chunk(redis: Client, queues: list[str]) -> dict[str, list[BandInfo]]:
    async with redis.pipeline(transaction=False) as pipe:
        for queue in queues:
            for s in keys.queue_streams_desc(queue):
                pipe.xlen(s)
                pipe.xinfo_groups(s)
        replies = await pipe.execute(raise_on_error=False)
    out: dict[str, list[BandInfo]] = {}
    starts: list[tuple[str, BandInfo, str]] = []
    for q_index, queue in enumerate(queues):
        bands = out[queue] = []
        for i, band in enumerate(keys.BANDS_DESC):
            depth, groups = replies[20 * q_index + 2 * i], replies[20 * q_index + 2 * i + 1]
            info = BandInfo(band=band, depth=depth if isinstance(depth, int) else 0,
                            exists=not isinstance(groups, ResponseError))
            group = _group_of(groups)
            if group is not None:
                info.pending = int(group.get("pending") or 0)
            if info.depth > 0:
                last = text(group.get("last-delivered-id")) if group else ""
                starts.append((queue, info, last))
            bands.append(info)
    if starts:
        async with redis.pipeline(transaction=False) as pipe:
            for queue, info, last in starts:
                stream = keys.stream(queue, info.band)
                pipe.xrange(stream, min=f"({last}" if last else "-", max="+", count=1)
                pipe.xrevrange(stream, max="+", min=f"({last}" if last else "-", count=1)
            ends = await pipe.execute(raise_on_error=False)
        for i, (_, info, _) in enumerate(starts):
            found = [queued_ms(e[0]) for e in ends[2 * i:2 * i + 2]
                     if e and not isinstance(e, Exception)]
            info.oldest_undelivered_ms = min(found) if found else 0
    return out


def queued_ms(entry: Any) -> int:
    """Epoch ms a band stream entry's task began to wait: its ``queued_at`` field (an
    entry put back unleased, because the session that read it does not take its type,
    keeps the first one), else the time in its id."""
    entry_id, fields = entry
    raw = fields.get(b"queued_at") or fields.get("queued_at") if fields else None
    return int(text(raw)) if raw else entry_ms(text(entry_id))


async def list_queues(redis: Client, size: int = 100, token: str = ""
                      ) -> tuple[list[QueueSummary], str]:
    """One page of the queue registry ``dtq:queues``, sorted by name.

    The page's names come from one ZRANGEBYLEX after ``token``, their numbers from
    one ``queue_summaries.lua`` call, so a page costs the same however many queues
    the registry holds.

    Args:
        size: most queues on the page (1..).
        token: the previous page's next_page_token ("" = first page).

    Returns:
        (queues, next page token; "" after the last page).

    Raises:
        InvalidArgument: malformed token (names ``page_token``).
    """
    validate_queue_page_token(token)
    names = [text(n) for n in await redis.zrangebylex(
        keys.QUEUES, f"({token}" if token else "-", "+", start=0, num=size + 1)]
    more = len(names) > size
    names = names[:size]
    out: list[QueueSummary] = []
    if names:
        # one call per queue (each touches one hash slot), one pipeline for the page
        rows = await call_chunks(redis, QUEUE_SUMMARIES, [
            ([*keys.queue_streams_desc(name), keys.paused(name)],
             QUEUE_SUMMARIES.argv(keys.GROUP)) for name in names])
        out = [QueueSummary(name=name, depth=int(depth), pending=int(pending),
                            paused=int(paused) == 1)
               for name, (depth, pending, paused) in zip(names, rows)]
    return out, (names[-1] if more and names else "")


async def _consumers(redis: Client, queue: str, bands: Iterable[BandInfo]) -> list[ConsumerInfo]:
    """XINFO CONSUMERS of every band, aggregated by consumer name."""
    with_group = [b for b in bands if b.exists]
    async with redis.pipeline(transaction=False) as pipe:
        for b in with_group:
            pipe.xinfo_consumers(keys.stream(queue, b.band), keys.GROUP)
        replies = await pipe.execute(raise_on_error=False)
    merged: dict[str, ConsumerInfo] = {}
    for reply in replies:
        if isinstance(reply, Exception):
            continue  # band without the group
        for c in reply:
            name = text(c.get("name"))
            idle = int(c.get("idle") or 0)
            info = merged.get(name)
            if info is None:
                merged[name] = ConsumerInfo(name=name, pending=int(c.get("pending") or 0),
                                            idle_ms=idle)
            else:
                info.pending += int(c.get("pending") or 0)
                info.idle_ms = min(info.idle_ms, idle)
    return [merged[n] for n in sorted(merged)]


async def scheduled_count(redis: Client, queue: str, scan_max: int = SCHEDULE_SCAN_MAX) -> int:
    """Scheduled tasks of ``queue`` (ZCARD of its schedule; ``scan_max`` is unused, kept
    for callers)."""
    return int(await redis.zcard(keys.schedule(queue)))


async def queue_stats(redis: Client, queue: str, heartbeat_interval_ms: int = 10_000
                      ) -> QueueStats:
    """Statistics of one queue.

    Args:
        heartbeat_interval_ms: the gateway's heartbeat interval; a worker is live
            while its last heartbeat is younger than 3 of them.

    Raises:
        InvalidArgument: bad queue name.
        NotFound: the queue has no band stream and is not in the registry.
    """
    validate_queue(queue)
    bands = await band_infos(redis, queue)
    if not any(b.exists for b in bands) and not await queue_known(redis, queue):
        raise NotFound(f"queue {queue!r} has no streams", reason="QUEUE_NOT_FOUND")
    now = await redis_now_ms(redis)
    waiting, complete = await waiting_by_type(redis, queue, now, heartbeat_interval_ms)
    oldest = [b.oldest_undelivered_ms for b in bands if b.oldest_undelivered_ms]
    age = max(0, now - min(oldest)) if oldest else 0
    if waiting:  # the scan saw every entry it read, wherever it sits in its band
        age = max(age, max(t.oldest_age_ms for t in waiting))
    return QueueStats(
        queue=queue, bands=bands, scheduled=await scheduled_count(redis, queue),
        oldest_task_age_ms=age,
        paused=bool(await redis.exists(keys.paused(queue))),
        dead_letter_depth=(await dead_letter_depth(redis, [queue])).get(queue, 0),
        consumers=await _consumers(redis, queue, bands),
        counters=await queue_counters(redis, queue), waiting_types=waiting,
        waiting_complete=complete, now_ms=now)


async def queue_known(redis: Client, queue: str) -> bool:
    """True when ``queue`` is in the queue registry (a task was enqueued to it or a
    worker leased from it), has a band stream, or has a pause flag (paused with
    ``create``). Single-key commands only, pipelined."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.zscore(keys.QUEUES, queue)
        for key in (keys.paused(queue), *keys.queue_streams_desc(queue)):
            pipe.exists(key)
        score, *found = await pipe.execute()
    return score is not None or any(found)


async def set_paused(redis: Client, queue: str, paused: bool, call: CallInfo, reason: str = "",
                     *, audit_maxlen: int = 10000, create: bool = False) -> bool:
    """Pause or resume a queue (flag, CONFIGURATION_CHANGED event, audit entry).

    Args:
        create: pause a queue that does not exist yet (no task enqueued to it, no
            worker leased from it), so its first tasks wait: the queue is added to
            the registry ``dtq:queues`` (ListQueues); ignored by resume.

    Returns:
        True when the flag changed.

    Raises:
        InvalidArgument: bad queue name.
        NotFound: (reason QUEUE_NOT_FOUND) the queue is unknown and ``create`` is
            not set for a pause; nothing is changed or audited.
    """
    validate_queue(queue)
    if not await queue_known(redis, queue):
        if not (paused and create):
            hint = "; set create to pause it before its first task" if paused else ""
            raise NotFound(f"queue: no queue named {queue!r}{hint}", reason="QUEUE_NOT_FOUND")
        await redis.zadd(keys.QUEUES, {queue: 0})  # ListQueues shows it from now on
    mode = "pause" if paused else "resume"
    changed, _ = await PAUSE_QUEUE(redis, [keys.paused(queue)], PAUSE_QUEUE.argv(
        mode, audit_maxlen, call.actor, call.request_id, reason[:1024], queue))
    detail = reason[:1024]
    if not int(changed):
        detail = (detail + "; " if detail else "") + "unchanged"
    await append_audit(redis, call.actor, f"{mode}_queue", queue, call.request_id, detail,
                       maxlen=audit_maxlen)
    return bool(changed)
