"""Held leases of a worker: buffer, handler slots, stops and reporting.

Every lease the gateway sent is an :class:`Execution` in ``held`` until its
result is handed to the reporter (or it is dropped as lost). Buffered
executions wait in FIFO order for one of ``concurrency`` slots. Leases of a
batch handler's type gather in a :class:`~dtq_pyworker._batch.Batch` instead
(no slot taken while it gathers); a closed batch waits in ``ready`` and runs in
one slot, ahead of buffered single tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor
from typing import cast

from dtq_proto import dtq_pb2
from dtq_pyworker import _tracing
from dtq_pyworker._batch import Batch, BatchHandler
from dtq_pyworker._batch_runtime import BatchRuntime
from dtq_pyworker._execute import (
    STOP_CANCELLED,
    STOP_DRAIN,
    STOP_LOST,
    Execution,
    Handler,
    Outcome,
    execute,
    fail_item,
    release_item,
    stop_outcome,
)
from dtq_pyworker._reporter import ResultReporter
from dtq_pyworker.context import TaskContext

log = logging.getLogger(__name__)

#: Seconds a stopped sync handler may take to return before the runtime logs that it
#: still runs in its thread (a handler that polls ``ctx.cancelled`` returns well within).
STUCK_WARN_S = 1.0


class Runtime(BatchRuntime):
    """Runs leased tasks within ``concurrency`` slots and reports their outcomes.

    Args:
        handlers: Handlers by task type (a :class:`BatchHandler` for batch types).
        concurrency: Handler slots.
        executor: Thread pool for sync handlers.
        reporter: Where outcomes go.
        worker_id: Id of this worker (for contexts).
        count: Callback ``count(name)`` bumping a worker counter.
    """

    def __init__(self, handlers: Mapping[str, Handler | BatchHandler], concurrency: int,
                 executor: Executor,
                 reporter: ResultReporter, worker_id: str,
                 count: Callable[[str], None]) -> None:
        self.handlers = handlers
        self.concurrency = concurrency
        self.executor = executor
        self.reporter = reporter
        self.worker_id = worker_id
        self._count = count
        self.held: dict[str, Execution] = {}
        self.buffer: deque[str] = deque()
        self.running: dict[str, asyncio.Task[None]] = {}
        self._orphans: set[Execution | Batch] = set()  # stopped, their sync thread runs on
        #: Seconds an orphan's thread may run on before the "still running" warning.
        self.stuck_warn_s = STUCK_WARN_S
        #: Pending "still running" warnings by orphan; orphans already warned about.
        self._stuck_timers: dict[Execution | Batch, asyncio.TimerHandle] = {}
        self._warned: set[Execution | Batch] = set()
        #: Gathering batch by task type; closed batches waiting for a slot; the batch of
        #: every lease that belongs to one (gathering, waiting or running).
        self.gathering: dict[str, Batch] = {}
        self.ready: deque[Batch] = deque()
        self._batch_of: dict[str, Batch] = {}
        self._batch_ids = itertools.count(1)
        #: Set when the worker drains: nothing more starts, new arrivals are released.
        self.draining = False
        #: Set when a handler stored a progress report (the heartbeat loop sends it early).
        self.progress_pending = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- intake -------------------------------------------------------------------
    def add(self, task: dtq_pb2.LeasedTask) -> None:
        """Take a leased task: buffer it and start it when a slot is free."""
        self.add_many((task,))

    def add_many(self, tasks: Iterable[dtq_pb2.LeasedTask]) -> None:
        """Take leased tasks in delivery order (one Lease stream message): buffer each,
        then start as many as there are free slots, in one pass."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        for task in tasks:
            self._hold(task)
        if self.draining:  # arrived in transit after the drain began: never runs
            self.release_buffered()
            return
        self.pump()

    def _hold(self, task: dtq_pb2.LeasedTask) -> None:
        lease_id = task.lease_id
        if lease_id in self.held:
            log.warning("duplicate lease ignored", extra={"lease_id": lease_id})
            return
        ctx = TaskContext(
            task_id=task.task_id, queue=task.queue, task_type=task.task_type,
            attempt=task.attempt, max_attempts=task.max_attempts, metadata=dict(task.metadata),
            timeout_ms=task.timeout_ms, worker_id=self.worker_id, lease_id=lease_id,
            priority=task.priority, content_type=task.content_type, payload_bytes=task.payload,
            traceparent=task.traceparent, tracestate=task.tracestate,
            _on_progress=self._progress_reported)
        ex = self.held[lease_id] = Execution(task=task, ctx=ctx)
        handler = self.handlers.get(task.task_type)
        if isinstance(handler, BatchHandler) and not self.draining:
            self._gather(ex, handler)
        else:
            self.buffer.append(lease_id)

    def _progress_reported(self) -> None:
        """Wake the heartbeat loop; called by TaskContext.progress from the loop or from
        a sync handler's thread."""
        loop = self._loop
        if loop is None:
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self.progress_pending.set()
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed: nothing to send
                loop.call_soon_threadsafe(self.progress_pending.set)

    def busy_slots(self) -> int:
        """Slots taken: running handlers plus stopped sync handlers still in their
        thread (a thread cannot be killed; its slot is free only when it returns)."""
        return len(self.running) + self.stuck_threads()

    def stuck_threads(self) -> int:
        """Sync handlers no longer waited for (timed out, cancelled, lost) whose
        thread has not returned yet."""
        if self._orphans:  # (pump asks after every task: no new set while none)
            self._orphans = {ex for ex in self._orphans if ex.in_thread}
        return len(self._orphans)

    def pump(self) -> None:
        """Start closed batches, then buffered executions, while slots are free."""
        while not self.draining and self.busy_slots() < self.concurrency:
            if self.ready:
                self._start_batch(self.ready.popleft())
                continue
            if not self.buffer:
                break
            lease_id = self.buffer.popleft()
            ex = self.held.get(lease_id)
            if ex is None:
                continue
            loop = self._loop or asyncio.get_running_loop()
            ex.handle = loop.create_task(self._run(ex), name=f"dtq-task-{ex.task.task_id}")
            ex.handle.add_done_callback(functools.partial(self._after_task, ex))
            self.running[lease_id] = ex.handle

    # -- stops ----------------------------------------------------------------------
    def stop(self, lease_ids: Iterable[str], reason: str) -> int:
        """Stop executions from outside (lost, cancelled or drain).

        A buffered execution is removed so it never runs; a running one has
        ``ctx.cancelled`` set and its asyncio task cancelled. Lost executions
        are never reported; cancelled ones are reported FAIL_MODE_CANCELLED,
        drained ones FAIL_MODE_RELEASE.

        Returns:
            How many held executions were affected.
        """
        hit = 0
        for lease_id in lease_ids:
            ex = self.held.get(lease_id)
            if ex is None or ex.stop_reason is not None:
                continue
            hit += 1
            ex.stop_reason = reason
            ex.ctx.cancelled.set()
            if lease_id in self._batch_of:
                self._stop_batch_item(ex)
            elif ex.handle is None:  # still buffered: never runs
                self._drop_buffered(ex)
            else:
                ex.handle.cancel()
        return hit

    def release_buffered(self) -> int:
        """Hand every buffered (not started) lease back with FAIL_MODE_RELEASE."""
        ids = [i for i in self.buffer if i in self.held]
        waiting = [*self.gathering.values(), *self.ready]
        ids += [ex.task.lease_id for batch in waiting for ex in batch.items]
        hit = self.stop(ids, STOP_DRAIN)
        for batch in self.gathering.values():
            if batch.timer is not None:
                batch.timer.cancel()
        self.gathering.clear()
        self.ready.clear()
        return hit

    def running_lease_ids(self) -> list[str]:
        """Leases whose handler runs now: single tasks and unreported batch items."""
        return [i for i in self.held
                if i in self.running or (i in self._batch_of and self._batch_of[i].handle)]

    def all_lease_ids(self) -> list[str]:
        """Every lease to extend: held executions plus results not yet sent."""
        ids = set(self.held)
        ids.update(self.reporter.pending_ids())
        return sorted(ids)

    def progress_reports(self) -> list[dtq_pb2.TaskProgress]:
        """Unsent progress reports of running handlers (one per lease, the latest),
        cleared: the heartbeat sends each once."""
        out = []
        for lease_id, ex in self.held.items():
            report = ex.ctx.take_progress()
            if report is not None and ex.stop_reason is None:
                out.append(dtq_pb2.TaskProgress(lease_id=lease_id, percent=report[0],
                                                message=report[1]))
        return out

    def threads_busy(self) -> int:
        """Sync handlers still in a pool thread, including ones already stopped."""
        return self.stuck_threads() + sum(1 for ex in self.held.values() if ex.in_thread)

    def _drop_buffered(self, ex: Execution) -> None:
        lease_id = ex.task.lease_id
        try:
            self.buffer.remove(lease_id)
        except ValueError:
            pass
        self.held.pop(lease_id, None)
        outcome = stop_outcome(lease_id, ex.stop_reason)
        if outcome is not None:
            self._report(ex, outcome)

    # -- running --------------------------------------------------------------------
    async def _run(self, ex: Execution) -> None:
        lease_id = ex.task.lease_id
        # batch handlers' tasks never get here (_gather takes them)
        handler = cast(Handler | None, self.handlers.get(ex.task.task_type))
        outcome: Outcome | None
        try:
            if handler is None:
                outcome = Outcome(fail=fail_item(
                    lease_id, "UnknownTaskType",
                    f"no handler for task type {ex.task.task_type!r}", False))
            else:
                outcome = await self._execute(handler, ex)
            if ex.stop_reason is not None:  # the handler swallowed our cancellation
                outcome = stop_outcome(lease_id, ex.stop_reason)
        except asyncio.CancelledError:
            outcome = stop_outcome(lease_id, ex.stop_reason)
            if outcome is None:  # torn down from outside: no report
                self._forget(lease_id)
                raise
        except Exception:
            log.exception("worker bug while running a task", extra={"lease_id": lease_id})
            outcome = Outcome(fail=fail_item(lease_id, "WorkerError", "internal worker error",
                                             True))
        self._forget(lease_id)
        if outcome is not None:  # None only for a stop reason that is not ours
            self._report(ex, outcome)
        self.pump()

    async def _execute(self, handler: Handler, ex: Execution) -> Outcome:
        """Run the handler, in a CONSUMER span when tracing is on (without it, no span
        context manager is entered: a no-op handler's cost stays small)."""
        if not _tracing.enabled():
            return await execute(handler, ex, self.executor)
        with _tracing.handler_span(ex.task) as span:
            outcome = await execute(handler, ex, self.executor)
            _tracing.set_outcome(span, outcome.fail is None,
                                 outcome.fail.error_class if outcome.fail else "")
        return outcome

    def _after_task(self, ex: Execution, _task: asyncio.Task[None]) -> None:
        self._after(ex)

    def _after(self, ex: Execution) -> None:
        """Clean up an execution whose task was cancelled before its first step."""
        lease_id = ex.task.lease_id
        if self.running.get(lease_id) is not ex.handle:
            return  # _run cleaned up itself
        self._forget(lease_id)
        outcome = stop_outcome(lease_id, ex.stop_reason)
        if outcome is not None:
            self._report(ex, outcome)
        self.pump()

    def _forget(self, lease_id: str) -> None:
        ex = self.held.pop(lease_id, None)
        self.running.pop(lease_id, None)
        if ex is not None and ex.in_thread:
            self._orphan(ex)

    def _orphan(self, ex: Execution | Batch) -> None:
        """Keep the slot of a handler whose thread runs on after we stopped waiting
        (its outcome, e.g. Timeout, is reported once, now): no new task takes the
        slot until the thread returns, so tasks behind it do not queue for a busy
        thread, and the heartbeat's active_tasks counts it.

        A handler that stops cooperatively (it polls ``ctx.cancelled``) returns at
        once and logs nothing; only one still in its thread ``stuck_warn_s`` seconds
        after the stop gets the "still running" WARNING (a timer, not a wait), and
        then the "slot free again" INFO line when it returns at last."""
        self._orphans.add(ex)
        loop = asyncio.get_running_loop()

        def exited() -> None:  # called from the pool thread
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._thread_returned, ex)

        ex.on_thread_exit = exited
        if not ex.in_thread:  # it returned before the callback was in place
            loop.call_soon(self._thread_returned, ex)
            return
        self._stuck_timers[ex] = loop.call_later(self.stuck_warn_s, self._warn_stuck, ex)

    def _warn_stuck(self, ex: Execution | Batch) -> None:
        """Log that a stopped handler's thread is still running ``stuck_warn_s`` after
        its stop (timer callback; nothing if it returned meanwhile)."""
        self._stuck_timers.pop(ex, None)
        if ex not in self._orphans or not ex.in_thread:
            return  # it returned; _thread_returned is on its way
        self._warned.add(ex)
        what = ex.log_extra() if isinstance(ex, Batch) else {
            "task_id": ex.task.task_id, "lease_id": ex.task.lease_id,
            "stop": ex.stop_reason or "timeout"}
        log.warning("handler still running in its thread after being stopped; its slot "
                    "stays taken until it returns",
                    extra={**what, "stuck_threads": self.stuck_threads(),
                           "stopped_s_ago": self.stuck_warn_s})

    def _thread_returned(self, ex: Execution | Batch) -> None:
        timer = self._stuck_timers.pop(ex, None)
        if timer is not None:  # returned within the grace: no warning, no info
            timer.cancel()
        self._orphans.discard(ex)
        if ex in self._warned:
            self._warned.discard(ex)
            log.info("stopped handler's thread returned; slot free again",
                     extra=ex.log_extra() if isinstance(ex, Batch) else
                     {"task_id": ex.task.task_id, "lease_id": ex.task.lease_id})
        self.pump()

    def _report(self, ex: Execution, outcome: Outcome) -> None:
        lease_id = ex.task.lease_id
        # a report made just before the handler returned goes out ahead of the result
        report = ex.ctx.take_progress() if ex.stop_reason is None else None
        progress = None if report is None else dtq_pb2.TaskProgress(
            lease_id=lease_id, percent=report[0], message=report[1])
        if outcome.ack_result is not None:
            self.reporter.ack(lease_id, outcome.ack_result, progress)
        elif outcome.fail is not None:
            if outcome.fail.error_class == "Timeout":
                self._count("timeouts")
            self.reporter.fail(outcome.fail, progress)
        elif ex.stop_reason == STOP_LOST:
            self._count("lost")
            log.info("lease lost, task stopped without report",
                     extra={"lease_id": lease_id, "task_id": ex.task.task_id})


__all__ = ["STOP_CANCELLED", "STOP_DRAIN", "STOP_LOST", "Runtime", "release_item"]
