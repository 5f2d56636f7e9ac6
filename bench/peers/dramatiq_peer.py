"""Dramatiq with its Redis broker: broker, no-op actor, adapter."""

from __future__ import annotations

import os
import sys
from importlib.metadata import version
from pathlib import Path

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from bench.peers import probe

broker = RedisBroker(url=os.environ["BENCH_REDIS_URL"])
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="bench", max_retries=0)
def noop(p: dict) -> None:
    """No-op actor: records timing only."""
    probe.hit(p)


class Adapter:
    """Producer side for the driver (dramatiq's enqueue is synchronous)."""

    config = "dramatiq --processes 1 --threads 8"
    concurrent = False
    enqueue_batch = None

    @staticmethod
    def version() -> str:
        return f"dramatiq {version('dramatiq')}"

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        broker.close()

    async def enqueue_one(self, p: dict) -> None:
        noop.send(p)

    @staticmethod
    def worker_cmd() -> list[str]:
        exe = str(Path(sys.executable).parent / "dramatiq")
        return [exe, "bench.peers.dramatiq_peer", "--processes", "1", "--threads", "8"]
