"""Worker app of the chaos suite: ``dtq-pyworker tests.system.apps.chaos_app:build_worker``.

Every handler appends one line per event to the file named by ``CHAOS_RUN_LOG``
(``<event> <task_id> <attempt> <worker_id> <lease_id>``), written with a single
``write`` on an ``O_APPEND`` descriptor so lines from several processes never
interleave. The tests read that file to learn which worker ran what, and when.

Task types (payload is a JSON object):

- ``chaos.sleep`` ``{"sleep_s": 0.2}``: logs ``start``, sleeps, logs ``done``.
- ``chaos.poison``: logs ``start`` and SIGKILLs its own worker process.
- ``chaos.fail_once`` ``{"retry_after_s": 1.0}``: attempt 1 logs ``start`` and raises
  :class:`~dtq_pyworker.Retry`; later attempts log ``start`` and ``done``.
- ``chaos.fail_always``: logs ``start`` and raises (dead-lettered after its attempts).
- ``chaos.block`` ``{"until_file": "/path"}``: logs ``start``, waits (at most 30 s)
  until the file exists, logs ``done``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from dtq_pyworker import Retry, TaskContext, Worker

#: Longest a chaos.block handler waits for its release file (s).
BLOCK_LIMIT_S = 30.0

POLL_S = 0.02  # release-file poll interval, bounded by BLOCK_LIMIT_S


def record(event: str, ctx: TaskContext) -> None:
    """Append one run-log line for ``ctx``'s task to ``$CHAOS_RUN_LOG``."""
    line = f"{event} {ctx.task_id} {ctx.attempt} {ctx.worker_id} {ctx.lease_id}\n"
    fd = os.open(os.environ["CHAOS_RUN_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def build_worker() -> Worker:
    """The chaos Worker; queues, target, ids and concurrency come from the CLI flags."""
    worker = Worker(queues=os.environ.get("DTQ_QUEUES", "chaos").split(","), drain_grace_s=1.0)

    @worker.task("chaos.sleep")
    async def sleep(payload: Any, ctx: TaskContext) -> dict[str, str]:
        record("start", ctx)
        await asyncio.sleep(float((payload or {}).get("sleep_s", 0.0)))
        record("done", ctx)
        return {"worker_id": ctx.worker_id}

    @worker.task("chaos.poison")
    def poison(payload: Any, ctx: TaskContext) -> None:
        record("start", ctx)
        os.kill(os.getpid(), signal.SIGKILL)

    @worker.task("chaos.fail_once")
    async def fail_once(payload: Any, ctx: TaskContext) -> dict[str, int]:
        record("start", ctx)
        if ctx.attempt == 1:
            raise Retry(after_s=float((payload or {}).get("retry_after_s", 1.0)))
        record("done", ctx)
        return {"attempt": ctx.attempt}

    @worker.task("chaos.fail_always")
    async def fail_always(payload: Any, ctx: TaskContext) -> None:
        record("start", ctx)
        raise RuntimeError("chaos.fail_always")

    @worker.task("chaos.block")
    async def block(payload: Any, ctx: TaskContext) -> dict[str, bool]:
        record("start", ctx)
        release = Path(payload["until_file"])
        deadline = time.monotonic() + BLOCK_LIMIT_S
        while not release.exists() and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        record("done", ctx)
        return {"released": release.exists()}

    return worker
