"""Celery with its Redis broker: app, no-op task, adapter."""

from __future__ import annotations

import os
import sys
from importlib.metadata import version
from pathlib import Path

from celery import Celery, group

from bench.peers import probe

app = Celery("bench", broker=os.environ["BENCH_REDIS_URL"])
app.conf.update(task_ignore_result=True, broker_connection_retry_on_startup=True,
                worker_hijack_root_logger=False)


@app.task(name="noop", ignore_result=True)
def noop(p: dict) -> None:
    """No-op task: records timing only."""
    probe.hit(p)


class Adapter:
    """Producer side for the driver: apply_async per task; group(...).apply_async as batch."""

    config = "celery worker -P solo (one process), no gossip/mingle/heartbeat, results off"
    concurrent = False

    @staticmethod
    def version() -> str:
        return f"celery {version('celery')}, kombu {version('kombu')}"

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        app.close()

    async def enqueue_one(self, p: dict) -> None:
        noop.apply_async((p,))

    async def enqueue_batch(self, items: list[dict]) -> None:
        group(noop.s(p) for p in items).apply_async()

    @staticmethod
    def worker_cmd() -> list[str]:
        exe = str(Path(sys.executable).parent / "celery")
        return [exe, "-A", "bench.peers.celery_peer", "worker", "-P", "solo", "-l", "WARNING",
                "--without-gossip", "--without-mingle", "--without-heartbeat"]
