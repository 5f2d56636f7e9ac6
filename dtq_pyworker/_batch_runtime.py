"""The batch half of :class:`~dtq_pyworker._runtime.Runtime`: gathering leases of a
batch handler's type, closing batches, running each in one slot and reporting every
item on its own (see :mod:`dtq_pyworker._batch`)."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import Executor
from typing import TYPE_CHECKING

from dtq_pyworker._batch import Batch, BatchHandler, execute_batch
from dtq_pyworker._execute import Execution, Outcome, fail_item, stop_outcome

log = logging.getLogger(__name__)


class BatchRuntime:
    """Mixed into Runtime, whose ``held``, ``running``, ``gathering``, ``ready``,
    ``_batch_of``, ``executor``, ``pump``, ``_report`` and ``_orphan`` it uses."""

    # set by Runtime.__init__
    held: dict[str, Execution]
    running: dict[str, asyncio.Task[None]]
    gathering: dict[str, Batch]
    ready: deque[Batch]
    _batch_of: dict[str, Batch]
    _batch_ids: Iterator[int]
    executor: Executor

    if TYPE_CHECKING:  # Runtime's methods
        def pump(self) -> None: ...
        def _report(self, ex: Execution, outcome: Outcome) -> None: ...
        def _orphan(self, ex: Execution | Batch) -> None: ...

    def _gather(self, ex: Execution, handler: BatchHandler) -> None:
        """Add ``ex`` to its type's gathering batch; close the batch when full."""
        task_type = ex.task.task_type
        batch = self.gathering.get(task_type)
        if batch is None:
            batch = self.gathering[task_type] = Batch(task_type, handler)
            batch.timer = asyncio.get_running_loop().call_later(
                handler.max_wait_ms / 1000.0, self._close_batch, batch)
        batch.items.append(ex)
        self._batch_of[ex.task.lease_id] = batch
        if len(batch.items) >= handler.max_size:
            self._close_batch(batch)

    def _close_batch(self, batch: Batch) -> None:
        """Stop gathering ``batch`` (full, or ``max_wait_ms`` passed): it waits for a slot."""
        if self.gathering.get(batch.task_type) is not batch:
            return  # released by a drain meanwhile
        del self.gathering[batch.task_type]
        if batch.timer is not None:
            batch.timer.cancel()
        if batch.items:
            self.ready.append(batch)
            self.pump()

    def _start_batch(self, batch: Batch) -> None:
        batch.key = f"batch-{next(self._batch_ids)}"
        batch.handle = asyncio.get_running_loop().create_task(
            self._run_batch(batch), name=f"dtq-{batch.key}-{batch.task_type}")
        batch.handle.add_done_callback(lambda _t: self._after_batch(batch))
        self.running[batch.key] = batch.handle

    def _stop_batch_item(self, ex: Execution) -> None:
        """Report a stopped batch item now (Cancelled, released, or nothing when lost);
        a waiting batch drops it, a running one ignores its result later. A running
        batch all of whose items are stopped is cancelled."""
        lease_id = ex.task.lease_id
        batch = self._batch_of.pop(lease_id)
        self.held.pop(lease_id, None)
        outcome = stop_outcome(lease_id, ex.stop_reason)
        if outcome is not None:
            self._report(ex, outcome)
        if batch.handle is None:
            batch.items.remove(ex)
        elif all(item.stop_reason is not None for item in batch.items):
            batch.handle.cancel()

    async def _run_batch(self, batch: Batch) -> None:
        try:
            outcomes = await execute_batch(batch, self.executor)
        except asyncio.CancelledError:
            if any(ex.task.lease_id in self._batch_of for ex in batch.items):
                self._end_batch(batch, {})  # torn down from outside: no report
                raise
            outcomes = {}  # every item stopped and was reported at its stop
        except Exception:
            log.exception("worker bug while running a batch", extra=batch.log_extra())
            outcomes = {ex.task.lease_id: Outcome(fail=fail_item(
                ex.task.lease_id, "WorkerError", "internal worker error", True))
                for ex in batch.items}
        self._end_batch(batch, outcomes)
        self.pump()

    def _after_batch(self, batch: Batch) -> None:
        """Clean up a batch whose task was cancelled before its first step."""
        if self.running.get(batch.key) is batch.handle:
            self._end_batch(batch, {})
            self.pump()

    def _end_batch(self, batch: Batch, outcomes: Mapping[str, Outcome]) -> None:
        """Report every item not reported yet (by ``outcomes``), free the slot."""
        self.running.pop(batch.key, None)
        for ex in batch.items:
            lease_id = ex.task.lease_id
            if self._batch_of.pop(lease_id, None) is None:
                continue  # stopped: reported at its stop
            self.held.pop(lease_id, None)
            if lease_id in outcomes:
                self._report(ex, outcomes[lease_id])
        if batch.in_thread:
            self._orphan(batch)
