"""Helpers shared by the worker tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from dtq_pyworker import Worker
from tests.worker.fake_broker import FakeBroker


@contextlib.asynccontextmanager
async def running(worker: Worker, stop_timeout_s: float = 10.0) -> AsyncIterator[asyncio.Task]:
    """Run ``worker`` in the background; on exit request a drain and wait for it."""
    task = asyncio.create_task(worker.run_async(install_signal_handlers=False))
    try:
        yield task
    finally:
        worker.stop()
        await asyncio.wait_for(task, stop_timeout_s)


def make_worker(fake: FakeBroker, **kwargs) -> Worker:
    """A Worker pointed at ``fake`` with test-friendly defaults."""
    kwargs.setdefault("worker_id", "w-test")
    kwargs.setdefault("concurrency", 4)
    kwargs.setdefault("drain_grace_s", 5.0)
    return Worker(["q"], fake.target, **kwargs)


async def wait_event(event: asyncio.Event, timeout_s: float = 5.0) -> None:
    """Wait for ``event`` with a deadline."""
    await asyncio.wait_for(event.wait(), timeout_s)


async def poll_until(predicate, timeout_s: float = 5.0, interval_s: float = 0.01) -> None:
    """Poll ``predicate()`` until it holds; fail after ``timeout_s``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not reached in time")
        await asyncio.sleep(interval_s)
