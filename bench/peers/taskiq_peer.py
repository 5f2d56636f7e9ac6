"""Taskiq with taskiq-redis streams (RedisStreamBroker): broker, no-op task, adapter."""

from __future__ import annotations

import os
import sys
from importlib.metadata import version
from pathlib import Path

from taskiq_redis import RedisStreamBroker

from bench.peers import probe

# consumer_id "0": the group must see a backlog enqueued before the worker starts.
broker = RedisStreamBroker(os.environ["BENCH_REDIS_URL"], queue_name="bench",
                           consumer_group_name="bench", consumer_id="0")


@broker.task(task_name="noop")
async def noop(p: dict) -> None:
    """No-op task: records timing only."""
    probe.hit(p)


class Adapter:
    """Producer side for the driver."""

    config = "taskiq worker --workers 1 (defaults: max-async-tasks, ack when_saved)"
    concurrent = True
    enqueue_batch = None

    @staticmethod
    def version() -> str:
        return f"taskiq {version('taskiq')}, taskiq-redis {version('taskiq-redis')}"

    async def start(self) -> None:
        await broker.startup()

    async def close(self) -> None:
        await broker.shutdown()

    async def enqueue_one(self, p: dict) -> None:
        await noop.kiq(p)

    @staticmethod
    def worker_cmd() -> list[str]:
        exe = str(Path(sys.executable).parent / "taskiq")
        return [exe, "worker", "bench.peers.taskiq_peer:broker", "--workers", "1",
                "--log-level", "WARNING"]
