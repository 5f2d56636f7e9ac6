"""The leftovers of drained queues, written directly to Redis for the idle-queue tests."""

from __future__ import annotations

import redis.asyncio as aioredis

from dtq_gateway.store import keys


async def leftovers(r: aioredis.Redis, n: int, prefix: str = "idle",
                    backfilled: bool = True) -> list[str]:
    """``n`` drained queues named ``<prefix><00000>``: ten empty band streams with the
    group each, registered in ``dtq:queues``; ``backfilled`` also sets the registry
    marker (a deployment whose registry exists, so no backfill SCAN runs)."""
    names = [f"{prefix}{i:05d}" for i in range(n)]
    for start in range(0, n, 200):
        pipe = r.pipeline(transaction=False)
        for q in names[start:start + 200]:
            for stream in keys.queue_streams_desc(q):
                pipe.xgroup_create(stream, keys.GROUP, id="0", mkstream=True)
        await pipe.execute()
    await r.zadd(keys.QUEUES, dict.fromkeys(names, 0))
    if backfilled:
        await r.set(keys.QUEUES_BACKFILLED, "1")
    return names
