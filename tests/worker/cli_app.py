"""A worker module loaded by the CLI tests (``dtq-pyworker tests.worker.cli_app:worker``)."""

from __future__ import annotations

import time

from dtq_pyworker import Worker

worker = Worker(["unused"], worker_id="cli-default", drain_grace_s=10)

WORK_SLICE_S = 0.01  # the simulated work checks ctx.cancelled this often
HANG_S = 120  # longer than any drain grace in the tests


@worker.task("echo")
def echo(payload, ctx):
    return {"echo": payload, "worker_id": ctx.worker_id}


@worker.task("slow")
def slow(payload, ctx):
    # Stands for real work of ~0.5 s that a drain must let finish.
    end = time.monotonic() + payload["seconds"]
    while time.monotonic() < end and not ctx.cancelled.is_set():
        time.sleep(WORK_SLICE_S)
    return {"slept": payload["seconds"]}


@worker.task("hang")
def hang(payload, ctx):
    # A handler that ignores ctx.cancelled: the process must still exit after the drain.
    time.sleep(HANG_S)


def build() -> Worker:
    """Factory form: ``dtq-pyworker tests.worker.cli_app:build``."""
    w = Worker(["unused"], worker_id="cli-built")
    w.register("echo", echo)
    return w
