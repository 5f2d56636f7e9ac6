"""Admin domain logic: the queue list, pause/resume (queue statistics: queue_stats.py).

Dead-letter operations live in :mod:`dtq_gateway.store.admin_dlq`, the helpers every
admin module shares (Redis TIME, reply integers, page tokens, :class:`CallInfo`) in
:mod:`dtq_gateway.store.admin_common`, which imports no admin module. Everything here reads
"now" from Redis TIME (one clock for every replica, see docs/design.md) and returns
plain dataclasses; ``admin_servicer`` converts them to protobuf.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dtq_gateway.errors import NotFound
from dtq_gateway.store import keys
from dtq_gateway.store.admin_common import (  # noqa: F401 (re-exported: callers use admin.*)
    CallInfo,
    as_int,
    entry_ms,
    redis_now_ms,
    validate_queue,
    validate_queue_page_token,
)
from dtq_gateway.store.admin_scripts import PAUSE_QUEUE, QUEUE_SUMMARIES
from dtq_gateway.store.audit import append_audit
from dtq_gateway.store.client import Client
from dtq_gateway.store.queue_stats import (  # noqa: F401 (re-exported: callers use admin.*)
    BandInfo,
    ConsumerInfo,
    QueueStats,
    band_infos,
    band_infos_many,
    queue_known,
    queue_stats,
    queued_ms,
    scheduled_count,
)
from dtq_gateway.store.replies import text
from dtq_gateway.store.scripts import call_chunks

_CHUNK = 500


@dataclass(frozen=True, slots=True)
class QueueSummary:
    """Headline numbers of one queue (ListQueues)."""

    name: str
    depth: int
    pending: int
    paused: bool

    @classmethod
    def of(cls, name: str, row: list[Any]) -> QueueSummary:
        """Decode queue_summaries.lua's item of one queue: ``{depth, pending, paused}``."""
        depth, pending, paused = row
        return cls(name=name, depth=int(depth), pending=int(pending),
                   paused=int(paused) == 1)


@dataclass(frozen=True, slots=True)
class PauseReply:
    """pause_queue.lua's reply: ``changed`` (the flag changed; False: it already had
    that value) and ``at_ms`` (epoch ms, Redis TIME)."""

    changed: bool
    at_ms: int

    @classmethod
    def of(cls, reply: list[Any]) -> PauseReply:
        """Decode ``{changed (1/0), ts}``."""
        return cls(bool(int(reply[0])), int(reply[1]))


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
        out = [QueueSummary.of(name, row) for name, row in zip(names, rows)]
    return out, (names[-1] if more and names else "")


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
    reply = PauseReply.of(await PAUSE_QUEUE(redis, [keys.paused(queue)], PAUSE_QUEUE.argv(
        mode, audit_maxlen, call.actor, call.request_id, reason[:1024], queue)))
    detail = reason[:1024]
    if not reply.changed:
        detail = (detail + "; " if detail else "") + "unchanged"
    await append_audit(redis, call.actor, f"{mode}_queue", queue, call.request_id, detail,
                       maxlen=audit_maxlen)
    return reply.changed
