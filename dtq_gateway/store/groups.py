"""Consumer groups and the queue registry: created once per queue per process.

Every band stream carries the group ``workers`` (keys.GROUP), created with
``XGROUP CREATE <stream> workers 0 MKSTREAM``. Starting at id 0 (not ``$``) means
entries added before the group existed (for example after a FLUSHALL, when an
XADD recreates a stream without its group) are still delivered.

The same round trip adds the queue to the registry ``dtq:queues`` (a sorted set,
every score 0, so ZRANGEBYLEX pages through it by name): ListQueues reads the
registry instead of SCANning the key space. :func:`backfill_registry` builds the
registry and the busy-queue set once for data written before they existed.
"""

from __future__ import annotations

import logging
import time

from redis.exceptions import OutOfMemoryError, ResponseError

from dtq_gateway import metrics
from dtq_gateway.errors import QueueLimit
from dtq_gateway.store import keys
from dtq_gateway.store.client import Client, scan_keys
from dtq_gateway.store.replies import text

log = logging.getLogger(__name__)

_CHUNK = 1000


class Groups:
    """Remembers which queues have their ten groups, so creation costs one round trip once.

    Args:
        max_queues: most names the registry may hold (DTQ_MAX_QUEUES); 0 = no bound.
    """

    def __init__(self, max_queues: int = 0) -> None:
        self._ready: set[str] = set()
        self._last_recreate_log = 0.0
        self.max_queues = max_queues

    async def ensure(self, redis: Client, queues: list[str] | set[str]) -> None:
        """Create the groups of every queue not yet known to have them (BUSYGROUP ignored)
        and add those queues to the registry, in one pipeline.

        Raises:
            QueueLimit: a queue is not in the registry and the registry already holds
                ``max_queues`` names (nothing is created for any of ``queues``).
        """
        refused = await self.ensure_some(redis, queues)
        if refused:
            raise queue_limit(min(refused), self.max_queues)

    async def ensure_some(self, redis: Client, queues: list[str] | set[str]) -> set[str]:
        """:meth:`ensure` for the queues that fit under ``max_queues``; returns the new
        names refused (the registry is full), counted in dtq_limit_refusals_total.

        The bound is checked with ZCARD + ZMSCORE before the ZADD, not atomically with
        it: replicas creating new names at the same instant may pass it by a few.
        """
        todo = [q for q in queues if q not in self._ready]
        if not todo:
            return set()
        refused: set[str] = set()
        if self.max_queues:
            async with redis.pipeline(transaction=False) as check:
                check.zcard(keys.QUEUES)
                check.zmscore(keys.QUEUES, todo)
                card, scores = await check.execute()
            new = [q for q, score in zip(todo, scores) if score is None]
            refused = set(new[max(0, self.max_queues - int(card)):])
            if refused:
                metrics.LIMIT_REFUSALS.labels(limit="max_queues").inc(len(refused))
                todo = [q for q in todo if q not in refused]
                if not todo:
                    return refused
        pipe = redis.pipeline(transaction=False)
        for q in todo:
            for stream in keys.queue_streams_desc(q):
                pipe.xgroup_create(stream, keys.GROUP, id="0", mkstream=True)
        pipe.zadd(keys.QUEUES, dict.fromkeys(todo, 0))
        replies = await pipe.execute(raise_on_error=False)
        if any(isinstance(r, OutOfMemoryError) for r in replies) \
                and await _all_present(redis, todo):
            replies = []  # Redis is full, but every group and registry entry exists
        for reply in replies:
            if isinstance(reply, ResponseError) and "BUSYGROUP" not in str(reply):
                raise reply
            if isinstance(reply, Exception) and not isinstance(reply, ResponseError):
                raise reply
        self._ready.update(todo)
        return refused

    def ready(self, queues: list[str]) -> bool:
        """True when every queue is known to have its groups (no round trip needed)."""
        return all(q in self._ready for q in queues)

    def discard(self, queues: list[str] | set[str]) -> None:
        """Forget queues this replica deleted (Admin.DeleteQueue), quietly: the next
        enqueue or lease of the name creates its groups again in one round trip."""
        self._ready.difference_update(queues)

    def forget(self, queues: list[str] | set[str]) -> None:
        """Forget queues whose streams answered NOGROUP (Redis restarted empty or flushed)."""
        now = time.monotonic()
        if now - self._last_recreate_log > 10:
            log.warning("consumer groups missing, recreating", extra={"queues": sorted(queues)})
            self._last_recreate_log = now
        self.discard(queues)


async def _all_present(redis: Client, queues: list[str]) -> bool:
    """True when every band stream of ``queues`` has the group ``workers`` and every
    queue is in the registry: read-only (XINFO GROUPS, ZMSCORE; one pipeline), for a
    full Redis, which refuses XGROUP CREATE even where the group exists, so that a
    gateway started while Redis is full can still lease from existing queues."""
    pipe = redis.pipeline(transaction=False)
    for q in queues:
        for stream in keys.queue_streams_desc(q):
            pipe.xinfo_groups(stream)
    pipe.zmscore(keys.QUEUES, queues)
    *groups, scores = await pipe.execute(raise_on_error=False)
    if isinstance(scores, Exception) or any(s is None for s in scores):
        return False
    return all(not isinstance(g, Exception)
               and any(text(i.get("name", b"")) == keys.GROUP for i in g) for g in groups)


def queue_limit(queue: str, max_queues: int, field: str = "queue") -> QueueLimit:
    """The error for a new queue name refused by DTQ_MAX_QUEUES."""
    return QueueLimit(f"{field}: queue {queue!r} would be new and the gateway already holds "
                      f"DTQ_MAX_QUEUES={max_queues} queues", field=field)


async def backfill_registry(redis: Client) -> bool:
    """Build ``dtq:queues`` and ``dtq:queues:busy`` from the band streams, once.

    Data written by a gateway that predates the registry and the busy set has streams
    that neither lists. Unless ``dtq:queues:backfilled`` says it was done, this SCANs
    the band streams once (every primary of a cluster), adds every queue to the
    registry and every queue with a non-empty stream or schedule to the busy set (its
    busy marker first), then sets the marker. Each replica runs it at
    the first reaper tick of each of its leaderships, so deleting the marker makes
    the next leader scan again.
    A queue that fills or drains meanwhile is harmless: filling scripts add it to the
    busy set themselves, and a member that is already empty leaves at the next reap.

    Returns:
        True when the scan ran (the marker was missing).
    """
    if await redis.exists(keys.QUEUES_BACKFILLED):
        return False
    streams: list[tuple[str, str]] = []
    async for key in scan_keys(redis, keys.BAND_STREAM_PATTERN, type_="STREAM"):
        parsed = keys.parse_stream(text(key))
        if parsed is not None:
            streams.append((text(key), parsed[0]))
    busy: set[str] = set()
    for start in range(0, len(streams), _CHUNK):
        chunk = streams[start:start + _CHUNK]
        async with redis.pipeline(transaction=False) as pipe:
            for stream, _ in chunk:
                pipe.xlen(stream)
            lengths = await pipe.execute()
        busy.update(q for (_, q), n in zip(chunk, lengths) if n)
    names = sorted({q for _, q in streams})
    for start in range(0, len(names), _CHUNK):
        names_chunk = names[start:start + _CHUNK]
        async with redis.pipeline(transaction=False) as pipe:
            for q in names_chunk:
                pipe.zcard(keys.schedule(q))
            scheduled = await pipe.execute()
        busy.update(q for q, n in zip(names_chunk, scheduled) if n)
        await redis.zadd(keys.QUEUES, dict.fromkeys(names_chunk, 0))
    busy_names = sorted(busy)
    for start in range(0, len(busy_names), _CHUNK):
        busy_chunk = busy_names[start:start + _CHUNK]
        # the queue's marker first, then the set (the order of every busy bookkeeping)
        async with redis.pipeline(transaction=False) as pipe:
            for q in busy_chunk:
                pipe.set(keys.busy_marker(q), "1")
            await pipe.execute()
        await redis.sadd(keys.BUSY_QUEUES, *busy_chunk)
    await redis.set(keys.QUEUES_BACKFILLED, "1")
    log.info("queue registry backfilled", extra={"queues": len(names), "busy": len(busy)})
    return True
