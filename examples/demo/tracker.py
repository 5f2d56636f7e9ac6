"""Follows the demo's tasks until every one is terminal.

Two sources, both cheap:

- ``Events.Subscribe`` (filtered to the demo queue and the terminal event types)
  marks tasks done as they finish. Pub/sub is lossy by design, so events are a
  fast path only.
- ``GetTask`` polling is the truth. It runs while events are quiet (or not
  available at all) and polls the outstanding tasks in the order they are most
  likely to be finished (highest priority band first, then enqueue order) in an
  adaptive window: when most of a window is terminal it grows and polls again at
  once, otherwise it shrinks and waits. So the number of calls stays close to the
  number of tasks, whatever the throughput.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence

import grpc

from dtq_proto import dtq_pb2, dtq_pb2_grpc
from examples.demo.producer import RETRY_DELAYS_S

log = logging.getLogger(__name__)

TERMINAL = frozenset({
    dtq_pb2.TASK_STATUS_SUCCEEDED, dtq_pb2.TASK_STATUS_DEAD_LETTERED,
    dtq_pb2.TASK_STATUS_CANCELLED, dtq_pb2.TASK_STATUS_EXPIRED,
})
_TERMINAL_EVENTS = {
    dtq_pb2.EVENT_TYPE_TASK_SUCCEEDED: dtq_pb2.TASK_STATUS_SUCCEEDED,
    dtq_pb2.EVENT_TYPE_TASK_DEAD_LETTERED: dtq_pb2.TASK_STATUS_DEAD_LETTERED,
    dtq_pb2.EVENT_TYPE_TASK_CANCELLED: dtq_pb2.TASK_STATUS_CANCELLED,
    dtq_pb2.EVENT_TYPE_TASK_EXPIRED: dtq_pb2.TASK_STATUS_EXPIRED,
}
GET_CONCURRENCY = 32
MIN_WINDOW, MAX_WINDOW = 32, 1024
POLL_PAUSE_S = 0.2
#: With events flowing, poll only after this long without a terminal event (s).
EVENTS_QUIET_S = 1.0

ProgressFn = Callable[[int, int], None]


async def get_tasks(stub: dtq_pb2_grpc.BrokerStub, task_ids: Iterable[str],
                    concurrency: int = GET_CONCURRENCY) -> dict[str, dtq_pb2.Task]:
    """GetTask for many ids, ``concurrency`` calls in flight at once.

    Args:
        stub: Broker stub on an aio channel.
        task_ids: Tasks to fetch.
        concurrency: Most calls in flight.

    Returns:
        task_id -> Task for every id the gateway knows (NOT_FOUND ids are left out).

    Raises:
        grpc.aio.AioRpcError: A call failed with anything but NOT_FOUND (UNAVAILABLE
            still after RETRY_DELAYS_S).
    """
    sem = asyncio.Semaphore(concurrency)
    out: dict[str, dtq_pb2.Task] = {}

    async def one(task_id: str) -> None:
        async with sem:
            for delay_s in (*RETRY_DELAYS_S, None):  # UNAVAILABLE: a Redis failover
                try:
                    resp = await stub.GetTask(dtq_pb2.GetTaskRequest(task_id=task_id),
                                              timeout=30)
                    break
                except grpc.aio.AioRpcError as err:
                    if err.code() == grpc.StatusCode.UNAVAILABLE and delay_s is not None:
                        await asyncio.sleep(delay_s)
                        continue
                    if err.code() != grpc.StatusCode.NOT_FOUND:
                        raise
                    log.warning("task %s not found", task_id)
                    return
            out[task_id] = resp.task

    await asyncio.gather(*(one(t) for t in task_ids))
    return out


class Tracker:
    """Counts the demo's tasks that reached a terminal state.

    Args:
        broker: Broker stub (GetTask).
        events: Events stub (Subscribe), or None to poll only.
        queue: Queue of the tasks (event filter).
        on_progress: Called with (terminal tasks, registered tasks) after changes.
    """

    def __init__(self, broker: dtq_pb2_grpc.BrokerStub, events: dtq_pb2_grpc.EventsStub | None,
                 queue: str, on_progress: ProgressFn) -> None:
        self._broker = broker
        self._events = events
        self._queue = queue
        self._on_progress = on_progress
        self._order: dict[str, tuple[int, int]] = {}  # task_id -> poll order key
        self._done: dict[str, int] = {}  # task_id -> terminal status (maybe not registered yet)
        self._finished = 0  # registered tasks in _done
        self._registration_open = True
        self._last_event = 0.0
        self._events_seen = 0
        self._polls = 0  # GetTask calls made while tracking
        self._changed = asyncio.Event()

    def register(self, tasks: Sequence[tuple[str, int]]) -> None:
        """Add enqueued tasks as (task_id, priority)."""
        for task_id, priority in tasks:
            if task_id in self._order:
                continue
            self._order[task_id] = (-priority, len(self._order))
            if task_id in self._done:  # its event arrived before the enqueue reply
                self._finished += 1
        self._changed.set()

    def close_registration(self) -> None:
        """No more tasks will be registered (enqueueing finished)."""
        self._registration_open = False
        self._changed.set()

    @property
    def finished(self) -> int:
        """Registered tasks known to be terminal."""
        return self._finished

    def outstanding(self) -> list[str]:
        """Registered tasks not yet known terminal, most-likely-finished first."""
        pending = [t for t in self._order if t not in self._done]
        pending.sort(key=self._order.__getitem__)
        return pending

    def _mark(self, task_id: str, status: int) -> None:
        if task_id not in self._done:
            self._done[task_id] = status
            if task_id in self._order:
                self._finished += 1
            self._changed.set()

    async def _follow_events(self) -> None:
        assert self._events is not None
        req = dtq_pb2.SubscribeRequest(queues=[self._queue], types=list(_TERMINAL_EVENTS))
        try:
            async for ev in self._events.Subscribe(req):
                status = _TERMINAL_EVENTS.get(ev.type)
                if status is not None and ev.task_id:
                    self._events_seen += 1
                    self._last_event = time.monotonic()
                    self._mark(ev.task_id, status)
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.CANCELLED:
                log.info("event stream unavailable (%s); polling GetTask only", err.code().name)

    async def _poll_window(self, window: int) -> float:
        """GetTask the first ``window`` outstanding tasks; return the terminal fraction."""
        ids = self.outstanding()[:window]
        if not ids:
            return 0.0
        tasks = await get_tasks(self._broker, ids)
        self._polls += len(ids)
        hits = 0
        for task_id, task in tasks.items():
            if task.status in TERMINAL:
                hits += 1
                self._mark(task_id, task.status)
        return hits / len(ids)

    def _events_fresh(self) -> bool:
        return self._events_seen > 0 and time.monotonic() - self._last_event < EVENTS_QUIET_S

    async def wait(self, timeout_s: float) -> bool:
        """Wait until registration is closed and every registered task is terminal.

        Args:
            timeout_s: Give up after this long (s).

        Returns:
            True when every task is terminal, False on timeout.
        """
        follower = asyncio.create_task(self._follow_events()) if self._events else None
        deadline = time.monotonic() + timeout_s
        window = MIN_WINDOW
        try:
            while time.monotonic() < deadline:
                self._on_progress(self.finished, len(self._order))
                if not self._registration_open and self.finished == len(self._order):
                    return True
                if self._events_fresh() or not self._order:
                    await self._wait_changed(POLL_PAUSE_S)
                    continue
                if await self._poll_window(window) >= 0.75:
                    window = min(MAX_WINDOW, window * 2)
                else:
                    window = max(MIN_WINDOW, window // 2)
                    await self._wait_changed(POLL_PAUSE_S)
            return False
        finally:
            if follower:
                follower.cancel()
                await asyncio.gather(follower, return_exceptions=True)
            log.info("tracked %d tasks: %d terminal events, %d GetTask polls",
                     len(self._order), self._events_seen, self._polls)

    async def _wait_changed(self, timeout_s: float) -> None:
        self._changed.clear()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        except TimeoutError:
            pass
