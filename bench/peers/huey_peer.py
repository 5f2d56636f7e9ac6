"""Huey (RedisHuey): instance, no-op task, adapter."""

from __future__ import annotations

import os
import sys
from importlib.metadata import version
from pathlib import Path

from huey import RedisHuey

from bench.peers import probe

huey = RedisHuey("bench", url=os.environ["BENCH_REDIS_URL"], results=False)


@huey.task()
def noop(p: dict) -> None:
    """No-op task: records timing only."""
    probe.hit(p)


class Adapter:
    """Producer side for the driver (huey's enqueue is synchronous)."""

    config = "huey_consumer -w 4 -k thread (blocking BRPOP)"
    concurrent = False
    enqueue_batch = None

    @staticmethod
    def version() -> str:
        return f"huey {version('huey')}"

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def enqueue_one(self, p: dict) -> None:
        noop(p)

    @staticmethod
    def worker_cmd() -> list[str]:
        exe = str(Path(sys.executable).parent / "huey_consumer")
        return [exe, "bench.peers.huey_peer.huey", "-w", "4", "-k", "thread", "-q"]
