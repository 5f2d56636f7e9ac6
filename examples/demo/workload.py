"""The demo's producer side in one coroutine: enqueue, track, fetch, summarise."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence

import grpc
from tqdm import tqdm

from dtq_proto import dtq_pb2, dtq_pb2_grpc
from examples.demo.producer import QUEUE, TaskSpec, enqueue_all
from examples.demo.summary import Summary, build
from examples.demo.tracker import Tracker, get_tasks

log = logging.getLogger(__name__)
#: Without a terminal (no progress bar), print a progress line this often (s).
PLAIN_PROGRESS_S = 5.0


async def wait_for_workers(admin: dtq_pb2_grpc.AdminStub, worker_ids: Sequence[str],
                           timeout_s: float = 15.0) -> bool:
    """Wait until ListWorkers shows every given worker alive.

    Enqueueing before the workers are connected would count their start-up time
    as queue wait. Gateways without the Admin service are not waited for.

    Args:
        admin: Admin stub.
        worker_ids: Worker ids to wait for.
        timeout_s: Give up after this long (s); the demo goes on anyway.

    Returns:
        True when all were seen.
    """
    deadline = time.monotonic() + timeout_s
    wanted = set(worker_ids)
    while time.monotonic() < deadline:
        try:
            resp = await admin.ListWorkers(dtq_pb2.ListWorkersRequest(), timeout=5)
        except grpc.aio.AioRpcError as err:
            log.info("ListWorkers unavailable (%s); not waiting for workers", err.code().name)
            return False
        if wanted <= {w.worker_id for w in resp.workers if w.alive}:
            return True
        await asyncio.sleep(0.1)
    log.warning("workers %s not all registered after %.0f s", sorted(wanted), timeout_s)
    return False


def _progress(bar: tqdm, total: int) -> Callable[[int, int], None]:
    """A Tracker progress callback that drives ``bar`` (or prints plain lines without a TTY)."""
    last_line = time.monotonic()

    def progress(done: int, registered: int) -> None:
        nonlocal last_line
        bar.set_postfix_str(f"enqueued {registered}", refresh=False)
        bar.update(done - bar.n)
        if bar.disable and time.monotonic() - last_line >= PLAIN_PROGRESS_S:
            last_line = time.monotonic()
            print(f"progress: {done:,}/{total:,} tasks done, {registered:,} enqueued",
                  flush=True)

    return progress


async def run(target: str, specs: Sequence[TaskSpec], worker_langs: Mapping[str, str],
              timeout_s: float) -> tuple[Summary, list[str]]:
    """Enqueue every task, show progress until all are terminal, build the summary.

    Args:
        target: Gateway address.
        specs: Tasks to enqueue.
        worker_langs: worker_id -> language of the workers started for the demo
            (waited for first).
        timeout_s: Deadline for every task to be terminal (s).

    Returns:
        The summary, and the per-item enqueue errors (empty when all went in).
    """
    async with grpc.aio.insecure_channel(target) as channel:
        broker = dtq_pb2_grpc.BrokerStub(channel)
        await wait_for_workers(dtq_pb2_grpc.AdminStub(channel), list(worker_langs))
        types: dict[str, str] = {}
        with tqdm(total=len(specs), unit="task", desc="tasks done", disable=None,
                  dynamic_ncols=True, mininterval=0.2) as bar:
            progress = _progress(bar, len(specs))
            tracker = Tracker(broker, dtq_pb2_grpc.EventsStub(channel), QUEUE, progress)

            def on_batch(batch: list[tuple[str, TaskSpec]]) -> None:
                types.update((task_id, spec.task_type) for task_id, spec in batch)
                tracker.register([(task_id, spec.priority) for task_id, spec in batch])

            waiter = asyncio.create_task(tracker.wait(timeout_s))
            try:
                _, errors = await enqueue_all(broker, specs, on_batch)
            except BaseException:
                waiter.cancel()
                raise
            tracker.close_registration()
            if not await waiter:
                log.error("not every task was terminal within %.0f s", timeout_s)
        tasks = await get_tasks(broker, types)
    return build(tasks, types, worker_langs), errors
