"""The idle-queue sweep's Redis work: registry size, busy checks, delete_idle_queue.lua.

:class:`~dtq_gateway.duties.queue_sweep.QueueSweep` paces the walk over the registry
``dtq:queues`` (pages of :func:`dtq_gateway.store.reaping.registry_page`) and picks the
names; these functions size the registry, read the busy set and delete what is idle.
Redis failures are raised as redis-py raises them (see :mod:`dtq_gateway.store.errors`).
"""

from __future__ import annotations

from dtq_gateway.store import keys
from dtq_gateway.store.client import Client
from dtq_gateway.store.replies import text
from dtq_gateway.store.scripts import Script, ScriptPipeline, execute

_DELETE_IDLE_QUEUE = Script("delete_idle_queue", allow_oom=True)


async def registry_size(redis: Client) -> int:
    """How many names the queue registry ``dtq:queues`` holds (ZCARD)."""
    return int(await redis.zcard(keys.QUEUES))


async def not_busy(redis: Client, names: list[str]) -> list[str]:
    """The valid queue names among ``names`` that are not in ``dtq:queues:busy``, in
    order: one SMISMEMBER, none when no name is valid."""
    names = [n for n in names if keys.QUEUE_RE.match(n)]
    if not names:
        return []
    busy = await redis.smismember(keys.BUSY_QUEUES, names)
    return [n for n, b in zip(names, busy) if not b]


async def listened_queues(redis: Client) -> set[str]:
    """The queues that workers with a live record lease from: the ``queues`` field of
    every ``dtq:workers`` member whose record still exists (a record expires three
    heartbeat intervals after its worker's last heartbeat) and whose status is not
    ``stopped`` or ``draining``. One SMEMBERS and one pipeline of HMGET (one round trip
    per 1,000 workers, in the ``{workers}`` slot)."""
    ids = [text(m) for m in await redis.smembers(keys.WORKERS)]
    out: set[str] = set()
    for start in range(0, len(ids), 1000):
        pipe = redis.pipeline(transaction=False)
        for worker_id in ids[start:start + 1000]:
            pipe.hmget(keys.worker(worker_id), "queues", "status")
        for queues, status in await pipe.execute():
            if queues and text(status) not in ("stopped", "draining"):
                out.update(n for n in text(queues).split(",") if n)
    return out


async def delete_idle_queues(redis: Client, queues: list[str], idle_ms: float) -> list[str]:
    """Delete the band streams of the queues nothing has used for ``idle_ms`` ms, and
    their registry names.

    One delete_idle_queue.lua call per queue (one pipeline; it keeps a paused, busy,
    non-empty or recently used queue, see its header). Then, per deleted queue, a
    single-key ``ZREM dtq:queues`` and an EXISTS of its streams, which re-adds the name
    (ZADD, score 0) when a gateway created the queue again in between. A script call
    that failed keeps its queue.

    Returns:
        The queues deleted, in the order of ``queues``.
    """
    pipe = ScriptPipeline(redis)
    for q in queues:
        _DELETE_IDLE_QUEUE.queue(pipe, [*keys.queue_streams_desc(q), keys.paused(q),
                                       keys.busy_marker(q)],
                                 _DELETE_IDLE_QUEUE.argv(keys.GROUP, idle_ms))
    deleted = [q for q, r in zip(queues, await execute(redis, pipe)) if r == 1]
    for q in deleted:
        await leave_registry(redis, q)
    return deleted


async def leave_registry(redis: Client, queue: str) -> None:
    """Remove a queue whose streams a script just deleted from the registry: a
    single-key ``ZREM dtq:queues``, then an EXISTS of its streams, its retry schedule
    and its busy marker, which re-adds the name (ZADD, score 0) when a gateway used the
    queue again in between (a delayed task only writes the schedule and the marker,
    and its enqueue's ZADD NX came before this ZREM)."""
    await redis.zrem(keys.QUEUES, queue)
    if await redis.exists(*keys.queue_streams_desc(queue), keys.schedule(queue),
                          keys.busy_marker(queue)):
        await redis.zadd(keys.QUEUES, {queue: 0})  # created again meanwhile
