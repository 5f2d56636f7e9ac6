"""The dtq worker of the scale bench, run by the reference CLI ``dtq-pyworker``.

``dtq-pyworker bench.scale_worker:make_worker --target HOST:PORT --queues Q1,Q2
--concurrency N`` with ``BENCH_SCALE_COUNTER`` (counter file) and ``BENCH_SCALE_READY``
(ready file) in the environment. ``make_worker`` returns only after the driver's
SIGUSR1 (:func:`bench.scale_probe.wait_for_go`); the async no-op handler records
each task in the counter file and nothing else.
"""

from __future__ import annotations

import os
from typing import Any

from bench import scale_probe
from dtq_pyworker import TaskContext, Worker


def make_worker() -> Worker:
    """A gated worker with an async no-op ``noop`` handler (queues come from ``--queues``)."""
    counter = scale_probe.Counter(os.environ["BENCH_SCALE_COUNTER"])
    worker = Worker(queues=["scale"], concurrency=32)

    @worker.task("noop")
    async def noop(payload: Any, ctx: TaskContext) -> None:
        counter.hit()

    scale_probe.wait_for_go(os.environ["BENCH_SCALE_READY"])
    return worker
