"""The dtq worker of the bench: one no-op task type, run by ``dtq-pyworker``.

``dtq-pyworker bench.dtq_worker:make_worker --queues Q --concurrency N``; the handler
records timing through :mod:`bench.peers.probe` (``$BENCH_OUT_DIR``), like the peers.
"""

from __future__ import annotations

from typing import Any

from bench.peers import probe
from dtq_pyworker import TaskContext, Worker


def make_worker() -> Worker:
    """A worker for queue ``bench`` with an async no-op ``noop`` handler."""
    worker = Worker(queues=["bench"], concurrency=32)

    @worker.task("noop")
    async def noop(payload: Any, ctx: TaskContext) -> None:
        probe.hit(payload)

    return worker
