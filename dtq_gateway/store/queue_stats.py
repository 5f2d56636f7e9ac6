"""GetQueueStats and the band numbers it shares with ListQueues' history: depth,
pending and the oldest undelivered task of each band stream, consumers, counters and
waiting tasks by type.

:func:`queue_stats` reads everything in two round trips: one pipeline for the
numbers of every key of the queue (the waiting-by-type script among them), the
workers registry and Redis TIME, and one for the first and last undelivered entry of
each band that holds entries together with the worker records (only when tasks wait).
On Redis Cluster TIME takes a round trip of its own (cluster pipelines refuse it). Everything is
read against Redis TIME (docs/design.md, "One clock").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from dtq_gateway.errors import NotFound
from dtq_gateway.store import keys
from dtq_gateway.store.admin_common import entry_ms, validate_queue
from dtq_gateway.store.admin_lists import worker_records
from dtq_gateway.store.admin_scripts import QUEUE_WAITING
from dtq_gateway.store.admin_waiting import (
    TypeWaiting,
    WaitingReply,
    counters_of,
    waiting_call,
    waiting_types,
)
from dtq_gateway.store.client import Client, is_cluster
from dtq_gateway.store.replies import text
from dtq_gateway.store.scripts import ScriptPipeline, execute

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
        """Types of waiting tasks no live worker of the queue takes (for their type or
        their required labels), sorted, each once."""
        return sorted({t.task_type for t in self.waiting_types if not t.taken})

    @property
    def depth(self) -> int:
        """Sum of band depths (entries)."""
        return sum(b.depth for b in self.bands)

    @property
    def pending(self) -> int:
        """Sum of band pending counts (entries)."""
        return sum(b.pending for b in self.bands)



def _group_of(groups: Any) -> dict[str, Any] | None:
    if isinstance(groups, Exception):
        return None
    for g in groups or ():
        if text(g.get("name")) == keys.GROUP:
            return g
    return None


def _band_info(band: int, depth: Any, groups: Any) -> tuple[BandInfo, str | None]:
    """A band's BandInfo from its XLEN and XINFO GROUPS replies, and where its
    undelivered entries start (the group's last-delivered-id, "" for the stream's
    start; None when the band holds no entry)."""
    info = BandInfo(band=band, depth=depth if isinstance(depth, int) else 0,
                    exists=not isinstance(groups, ResponseError))
    group = _group_of(groups)
    if group is not None:
        info.pending = int(group.get("pending") or 0)
    if info.depth <= 0:
        return info, None
    return info, text(group.get("last-delivered-id")) if group else ""


def _queue_undelivered(pipe: Any, starts: list[tuple[str, BandInfo, str]]) -> None:
    """Queue the XRANGE / XREVRANGE COUNT 1 after each start (see :func:`band_infos`)."""
    for queue, info, last in starts:
        stream = keys.stream(queue, info.band)
        pipe.xrange(stream, min=f"({last}" if last else "-", max="+", count=1)
        pipe.xrevrange(stream, max="+", min=f"({last}" if last else "-", count=1)


def _apply_undelivered(starts: list[tuple[str, BandInfo, str]], ends: list[Any]) -> None:
    """Set ``oldest_undelivered_ms`` from the replies of :func:`_queue_undelivered`."""
    for i, (_, info, _) in enumerate(starts):
        found = [queued_ms(e[0]) for e in ends[2 * i:2 * i + 2]
                 if e and not isinstance(e, Exception)]
        info.oldest_undelivered_ms = min(found) if found else 0


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
            at = 20 * q_index + 2 * i
            info, last = _band_info(band, replies[at], replies[at + 1])
            if last is not None:
                starts.append((queue, info, last))
            bands.append(info)
    if starts:
        async with redis.pipeline(transaction=False) as pipe:
            _queue_undelivered(pipe, starts)
            ends = await pipe.execute(raise_on_error=False)
        _apply_undelivered(starts, ends)
    return out


def queued_ms(entry: Any) -> int:
    """Epoch ms a band stream entry's task began to wait: its ``queued_at`` field (an
    entry put back unleased, because the session that read it does not take its type,
    keeps the first one), else the time in its id."""
    entry_id, fields = entry
    raw = fields.get(b"queued_at") or fields.get("queued_at") if fields else None
    return int(text(raw)) if raw else entry_ms(text(entry_id))


def _consumers(replies: list[Any]) -> list[ConsumerInfo]:
    """XINFO CONSUMERS replies of the bands, aggregated by consumer name (a band
    without the group answers an error, skipped)."""
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


#: Replies of the first pipeline of queue_stats after the 3 per band, in this order
#: (TIME last; a cluster pipeline refuses TIME, which is then read on its own).
_SINGLES = ("scheduled", "paused", "dead_letters", "counters", "registered", "waiting",
            "worker_ids", "time")


def _ok(reply: Any) -> Any:
    """A reply that must not be an error (raised in its place)."""
    if isinstance(reply, Exception):
        raise reply
    return reply


async def _first_round(redis: Client, queue: str) -> tuple[list[Any], dict[str, Any]]:
    """One pipeline: XLEN, XINFO GROUPS and XINFO CONSUMERS of each band, then the
    replies named by :data:`_SINGLES`. Returns (per-band replies, named replies)."""
    streams = keys.queue_streams_desc(queue)
    pipe = ScriptPipeline(redis)  # a script call rides in it (QUEUE_WAITING)
    for s in streams:
        pipe.xlen(s)
        pipe.xinfo_groups(s)
        pipe.xinfo_consumers(s, keys.GROUP)
    pipe.zcard(keys.schedule(queue))
    pipe.exists(keys.paused(queue))
    pipe.xlen(keys.dead_letter(queue))
    pipe.hgetall(keys.queue_counters(queue))
    pipe.zscore(keys.QUEUES, queue)
    QUEUE_WAITING.queue(pipe, *waiting_call(queue))
    pipe.smembers(keys.WORKERS)
    if not is_cluster(redis):
        pipe.time()
    replies = await execute(redis, pipe)
    if is_cluster(redis):
        replies.append(await redis.time())
    per_band = 3 * len(streams)
    return replies[:per_band], dict(zip(_SINGLES, replies[per_band:]))


async def _second_round(redis: Client, starts: list[tuple[str, BandInfo, str]],
                        worker_ids: list[str]) -> list[Any]:
    """One pipeline (none when there is nothing to read): the undelivered ends of
    ``starts`` and the HGETALL of each worker. Returns the worker hashes."""
    if not starts and not worker_ids:
        return []
    pipe = redis.pipeline(transaction=False)
    _queue_undelivered(pipe, starts)
    for worker_id in worker_ids:
        pipe.hgetall(keys.worker(worker_id))
    replies = await pipe.execute(raise_on_error=False)
    _apply_undelivered(starts, replies[:2 * len(starts)])
    return [_ok(r) for r in replies[2 * len(starts):]]


async def queue_stats(redis: Client, queue: str, heartbeat_interval_ms: int = 10_000
                      ) -> QueueStats:
    """Statistics of one queue, in two round trips (one when it holds no entry and
    no task waits; one more on Redis Cluster, which reads TIME on its own; see the
    module docstring).

    Args:
        heartbeat_interval_ms: the gateway's heartbeat interval; a worker is live
            while its last heartbeat is younger than 3 of them.

    Raises:
        InvalidArgument: bad queue name.
        NotFound: the queue has no band stream and is not in the registry.
    """
    validate_queue(queue)
    per_band, one = await _first_round(redis, queue)
    bands, starts = [], []
    for i, band in enumerate(keys.BANDS_DESC):
        info, last = _band_info(band, per_band[3 * i], per_band[3 * i + 1])
        bands.append(info)
        if last is not None:
            starts.append((queue, info, last))
    paused = bool(_ok(one["paused"]))
    if not any(b.exists for b in bands) and _ok(one["registered"]) is None and not paused:
        raise NotFound(f"queue {queue!r} has no streams", reason="QUEUE_NOT_FOUND")
    sec, usec = _ok(one["time"])
    now = int(sec) * 1000 + int(usec) // 1000
    waiting_reply = WaitingReply.of(_ok(one["waiting"]))
    ids = sorted(text(m) for m in _ok(one["worker_ids"])) if waiting_reply.rows else []
    hashes = await _second_round(redis, starts, ids)
    waiting, complete = waiting_types(
        waiting_reply, queue, now, worker_records(ids, hashes, now, heartbeat_interval_ms))
    oldest = [b.oldest_undelivered_ms for b in bands if b.oldest_undelivered_ms]
    age = max(0, now - min(oldest)) if oldest else 0
    if waiting:  # the scan saw every entry it read, wherever it sits in its band
        age = max(age, max(t.oldest_age_ms for t in waiting))
    return QueueStats(
        queue=queue, bands=bands, scheduled=int(_ok(one["scheduled"])),
        oldest_task_age_ms=age, paused=paused,
        dead_letter_depth=int(_ok(one["dead_letters"])),
        consumers=_consumers(per_band[2::3]), counters=counters_of(_ok(one["counters"])),
        waiting_types=waiting, waiting_complete=complete, now_ms=now)
