"""arq: worker settings, no-op job, adapter."""

from __future__ import annotations

import os
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

from arq import create_pool
from arq.connections import RedisSettings

from bench.peers import probe

REDIS = RedisSettings.from_dsn(os.environ["BENCH_REDIS_URL"])


async def noop(ctx: dict[str, Any], p: dict) -> None:
    """No-op job: records timing only."""
    probe.hit(p)


class WorkerSettings:
    """arq worker configuration, tuned for throughput.

    arq's defaults (poll every 0.5 s, 10 jobs at a time) cap a worker near 200 jobs/s
    and put ~250 ms of poll delay into every latency; a user after throughput would
    raise both, so the bench does. Results are kept (arq's default, 1 h).
    """

    functions = (noop,)
    redis_settings = REDIS
    max_jobs = 100
    poll_delay = 0.01


class Adapter:
    """Producer side for the driver."""

    config = "arq worker, max_jobs 100, poll_delay 10 ms (default 0.5 s), keep_result 3600 s"
    concurrent = True
    enqueue_batch = None

    def __init__(self) -> None:
        self.pool: Any = None

    @staticmethod
    def version() -> str:
        return f"arq {version('arq')}"

    async def start(self) -> None:
        self.pool = await create_pool(REDIS)

    async def close(self) -> None:
        await self.pool.aclose()

    async def enqueue_one(self, p: dict) -> None:
        await self.pool.enqueue_job("noop", p)

    @staticmethod
    def worker_cmd() -> list[str]:
        exe = str(Path(sys.executable).parent / "arq")
        return [exe, "bench.peers.arq_peer.WorkerSettings"]
