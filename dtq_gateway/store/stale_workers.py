"""The stale-worker sweep's Redis work: the worker set, worker_sweep.lua.

:class:`~dtq_gateway.duties.scheduler.WorkerSweep` batches and counts; these functions
read ``dtq:workers`` and check its members. Redis failures of a whole round trip are
raised as redis-py raises them (see :mod:`dtq_gateway.store.errors`).
"""

from __future__ import annotations

from dtq_gateway.store import keys
from dtq_gateway.store.client import Client
from dtq_gateway.store.replies import text
from dtq_gateway.store.scripts import Script, ScriptPipeline, execute

_WORKER_SWEEP = Script("worker_sweep", allow_oom=True)


async def worker_ids(redis: Client) -> list[str]:
    """Members of ``dtq:workers`` (SSCAN, 500 per page; a member may repeat)."""
    return [text(m) async for m in redis.sscan_iter(keys.WORKERS, count=500)]


async def sweep_workers(redis: Client, worker_ids: list[str], stale_after_ms: int
                        ) -> list[str | Exception]:
    """One worker_sweep.lua call per worker, one pipeline: a worker whose hash expired
    is removed, one alive whose last heartbeat is older than ``stale_after_ms`` ms
    becomes stale (WORKER_STALE published once either way), one stopped that long ago
    is forgotten.

    Returns:
        Per worker, in order, the script's outcome ("removed", "stale", "forgotten",
        "ok") or its error.
    """
    pipe = ScriptPipeline(redis)
    for worker_id in worker_ids:
        _WORKER_SWEEP.queue(pipe, [keys.WORKERS, keys.worker(worker_id)],
                            _WORKER_SWEEP.argv(worker_id, stale_after_ms))
    return [r if isinstance(r, Exception) else text(r) for r in await execute(redis, pipe)]
