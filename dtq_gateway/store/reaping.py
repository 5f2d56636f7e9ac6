"""The reaper's Redis work: the busy set, reap_queue.lua, reclaim.lua, consumer pruning.

:class:`~dtq_gateway.duties.reaper.Reaper` decides what to reap and when (leadership,
holds, cursors, batching, counts); these functions send its commands. Each one is the
number of round trips its docstring says: a batch of script calls is one pipeline, and
a script call that fails comes back as an exception in its place (the others run).
Connection errors of the whole round trip are raised as redis-py raises them (see
:data:`dtq_gateway.store.errors.OUTAGE_ERRORS`).

The busy set ``dtq:queues:busy`` and the dead-letter index ``dtq:queues:dead-letter``
span queues (docs/redis-layout.md), so they are kept with single-key commands next to
each queue's scripts; :func:`leave_busy_set` and the repair reads below close the gaps
that two steps leave.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dtq_gateway.store import keys
from dtq_gateway.store.client import Client
from dtq_gateway.store.indexes import queue_set_add, set_add
from dtq_gateway.store.leasing import entry_idem_digest
from dtq_gateway.store.replies import text
from dtq_gateway.store.scripts import Script, ScriptPipeline, execute

_REAP_QUEUE = Script("reap_queue", allow_oom=True)
_RECLAIM = Script("reclaim", helpers=("_finished", "_concurrency"), allow_oom=True)
_PRUNE_CONSUMERS = Script("prune_consumers", allow_oom=True)

#: A claimed entry: (queue, band stream key, the entry as read: (entry id, flat fields)).
#: The reaper only reads the first two; :func:`reclaim` takes it back whole.
Claimed = tuple[str, str, Any]


@dataclass(frozen=True, slots=True)
class Reaped:
    """One queue's reap_queue.lua reply.

    Attributes:
        drained: every band stream and the schedule were empty and the queue's busy
            marker was deleted (the caller then calls :func:`leave_busy_set`).
        claimed: entries now pending on the reaper consumer, band by band.
        deleted: entries deleted while pending, acked away by the script.
        cursors: stream index 1..10 (p9..p0) -> XAUTOCLAIM cursor of the PEL scans
            that did not wrap around (empty when all did).
    """

    drained: bool
    claimed: list[Claimed]
    deleted: int
    cursors: dict[int, str]


async def busy_set(redis: Client) -> set[str]:
    """Every member of ``dtq:queues:busy`` as is (SSCAN, 1000 per page)."""
    return {text(m) async for m in redis.sscan_iter(keys.BUSY_QUEUES, count=1000)}


async def busy_queues(redis: Client) -> list[str]:
    """Members of ``dtq:queues:busy`` that are valid queue names, sorted (SSCAN)."""
    return sorted(q for q in await busy_set(redis) if keys.QUEUE_RE.match(q))


async def reap_queues(redis: Client, queues: list[str], cursors: dict[str, dict[int, str]],
                      visibility_timeout_ms: int, claim_count: int
                      ) -> list[Reaped | Exception]:
    """One reap_queue.lua call per queue, one pipeline.

    Args:
        queues: busy queues.
        cursors: queue -> {stream index 1..10: cursor} of unfinished PEL scans (an
            absent queue or index starts at "0-0").
        visibility_timeout_ms: idle time after which a pending entry is claimed (ms).
        claim_count: most entries claimed per stream.

    Returns:
        Per queue, in order, its :class:`Reaped` or the script's error.
    """
    pipe = ScriptPipeline(redis)
    for q in queues:
        at = cursors.get(q, {})
        _REAP_QUEUE.queue(pipe, [*keys.queue_streams_desc(q), keys.busy_marker(q),
                                 keys.schedule(q)],
                          _REAP_QUEUE.argv(keys.GROUP, keys.REAPER_CONSUMER,
                                           visibility_timeout_ms, claim_count, q,
                                           *(at.get(i, "0-0") for i in range(1, 11))))
    return [reply if isinstance(reply, Exception) else _reaped(q, reply)
            for q, reply in zip(queues, await execute(redis, pipe))]


def _reaped(queue: str, reply: Any) -> Reaped:
    streams = keys.queue_streams_desc(queue)
    claimed: list[Claimed] = []
    cursors: dict[int, str] = {}
    deleted = 0
    for index, cursor, entries, gone in reply[1:]:
        stream = streams[int(index) - 1]
        deleted += len(gone)
        claimed += [(queue, stream, e) for e in entries]
        if text(cursor) != "0-0":
            cursors[int(index)] = text(cursor)
    return Reaped(int(reply[0]) == 1, claimed, deleted, cursors)


async def leave_busy_set(redis: Client, queues: list[str]) -> None:
    """Remove drained queues (their busy markers just deleted) from the busy set.

    The busy set spans queues, so this is a single-key SREM after the queue's script,
    then a re-read of the markers (EXISTS each, one pipeline): a queue that became busy
    again in between (its enqueue set the marker; the SADD that follows it may have
    landed before this SREM) is added back (SADD). Every interleaving leaves a busy
    queue in the set: an enqueue that set the marker before the re-read is seen by it,
    one after it does its own SADD after this SREM. Two or three round trips; none for
    no queues.
    """
    if not queues:
        return
    await redis.srem(keys.BUSY_QUEUES, *queues)
    pipe = redis.pipeline(transaction=False)
    for q in queues:
        pipe.exists(keys.busy_marker(q))
    again = [q for q, n in zip(queues, await pipe.execute()) if int(n)]
    if again:
        await set_add(redis, keys.BUSY_QUEUES, again)


async def reclaim(redis: Client, claimed: list[Claimed], dlq_maxlen: int,
                  task_retention_s: int) -> list[str | Exception]:
    """One reclaim.lua call per claimed entry, one pipeline that first adds the
    entries' queues to the dead-letter index (a reclaim may dead-letter).

    Args:
        claimed: entries from :func:`reap_queues`.
        dlq_maxlen: dead-letter stream MAXLEN (approximate, entries).
        task_retention_s: TTL of a task record that ends here (s).

    Returns:
        Per entry, in order, the script's outcome ("retried", "dead_lettered",
        "absorbed", "requeued", "cancelled", "not_owned") or its error.
    """
    pipe = ScriptPipeline(redis)
    queue_set_add(pipe, keys.DEAD_LETTER_QUEUES, {queue for queue, _, _ in claimed})
    for queue, stream, (entry_id, flat) in claimed:
        fields = {text(flat[i]): text(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}
        keys_ = [stream, keys.task(fields.get("task_id", "")), keys.dead_letter(queue),
                 keys.cancelled(queue), keys.queue_counters(queue)]
        digest = entry_idem_digest(fields)
        if digest:
            keys_.append(keys.idempotency(queue, digest))
        _RECLAIM.queue(pipe, keys_, _RECLAIM.argv(
            text(entry_id), fields.get("attempt", "0"), dlq_maxlen, task_retention_s,
            keys.GROUP, keys.REAPER_CONSUMER))
    replies = await execute(redis, pipe)
    return [r if isinstance(r, Exception) else text(r) for r in replies[1:]]


async def prune_consumers(redis: Client, queues: list[str], idle_ms: int
                          ) -> list[int | Exception]:
    """Delete the consumers of gone workers (no pending entry, no read for ``idle_ms``
    ms; never the reaper's) in these queues: one prune_consumers.lua call per queue,
    one pipeline.

    Returns:
        Per queue, in order, how many consumers were deleted, or the script's error.
    """
    pipe = ScriptPipeline(redis)
    for q in queues:
        _PRUNE_CONSUMERS.queue(pipe, keys.queue_streams_desc(q), _PRUNE_CONSUMERS.argv(
            keys.GROUP, idle_ms, keys.REAPER_CONSUMER))
    return [r if isinstance(r, Exception) else int(r) for r in await execute(redis, pipe)]


async def dead_letter_index(redis: Client) -> set[str]:
    """Members of ``dtq:queues:dead-letter`` (SMEMBERS)."""
    return {text(m) for m in await redis.smembers(keys.DEAD_LETTER_QUEUES)}


async def registry_page(redis: Client, after: str, count: int) -> list[str]:
    """Up to ``count`` names of the queue registry ``dtq:queues`` after ``after`` in
    name order ("" = from the start); one ZRANGEBYLEX."""
    return [text(n) for n in await redis.zrangebylex(
        keys.QUEUES, f"({after}" if after else "-", "+", start=0, num=count)]


async def queue_markers(redis: Client, queues: list[str]) -> list[tuple[bool, bool]]:
    """Per queue, in order: (its busy marker exists, its dead-letter stream exists).
    Two EXISTS per queue, one pipeline."""
    pipe = redis.pipeline(transaction=False)
    for q in queues:
        pipe.exists(keys.busy_marker(q))
        pipe.exists(keys.dead_letter(q))
    replies = [int(r) for r in await pipe.execute()]
    return [(bool(replies[2 * i]), bool(replies[2 * i + 1])) for i in range(len(queues))]


async def add_to_busy_set(redis: Client, queues: list[str]) -> None:
    """SADD ``queues`` (not empty) to ``dtq:queues:busy``."""
    await set_add(redis, keys.BUSY_QUEUES, queues)


async def add_to_dead_letter_index(redis: Client, queues: list[str]) -> None:
    """SADD ``queues`` (not empty) to ``dtq:queues:dead-letter``."""
    await set_add(redis, keys.DEAD_LETTER_QUEUES, queues)
