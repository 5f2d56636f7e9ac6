"""Coalesces Ack and Fail items into few batched calls.

One unary call per finished task would cap a worker's throughput at the RPC
rate; instead results wait up to ``flush_ms`` (or until ``max_items`` are
queued) and go out as one Ack call and one Fail call. Each item is answered on
its own in the response. Calls that fail for a transient reason are retried
with backoff: the leases stay alive meanwhile because the heartbeat lists the
pending lease ids (see :meth:`ResultReporter.pending_ids`).

An item is retried until it gets an answer even when a heartbeat reports its lease
lost: an Ack the gateway applied whose reply was lost (a gateway that died right after
applying it) also makes the lease lost, and only the resend's answer (``duplicate``)
says it succeeded. A result of a lease that really ended is refused (STALE_LEASE) and
changes nothing, so the answer alone decides how each item counts.

A progress report the handler made just before it returned (not yet sent by the
heartbeat loop) travels with its result: each round first sends the round's reports on
one progress-only Heartbeat (``send_progress``), then the Ack and Fail calls, so the
report is stored on the task before the result ends its lease.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc

from dtq_proto import dtq_pb2
from dtq_pyworker._backoff import Backoff
from dtq_pyworker.errors import DtqRpcError

log = logging.getLogger(__name__)

Item = dtq_pb2.AckItem | dtq_pb2.FailItem
#: One kind of item (an Ack batch or a Fail batch keeps its own kind).
_I = TypeVar("_I", dtq_pb2.AckItem, dtq_pb2.FailItem)
_T = TypeVar("_T")
#: Called once per item with (item, LeaseResult or None, error or None).
DoneCallback = Callable[[Item, "dtq_pb2.LeaseResult | None", "DtqRpcError | None"], None]

TRANSIENT = frozenset({
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
})


class ResultReporter:
    """Batches Ack and Fail items and sends them in the background.

    Args:
        stub: A ``dtq_pb2_grpc.BrokerStub`` on a grpc.aio channel.
        flush_ms: Longest time an item waits for companions, in ms.
        max_items: Items per call; a full batch is sent at once.
        on_done: Callback per finished item (for counters).
        rpc_timeout_s: Deadline of each Ack/Fail call in seconds.
        flush_early: Called with the number of queued items after each push;
            True sends at once instead of waiting for the window (the worker says
            so when holding results back would starve its lease credit).
        idle: Asked after each push; True (nothing left running, so few results can
            join) sends within ``idle_flush_ms`` instead of the full window. A short
            window rather than none: tasks arriving back to back on the Lease stream
            then share one Ack call instead of one call each.
        idle_flush_ms: The window while ``idle`` says so, in ms.
        send_progress: Coroutine function sending a list of ``TaskProgress`` on a
            Heartbeat that lists just their leases; awaited before the round's Ack and
            Fail calls when the round carries reports. Its errors are logged and the
            results go out anyway (a report is best effort, a result is not).
    """

    def __init__(self, stub: Any, *, flush_ms: float = 5.0, max_items: int = 256,
                 on_done: DoneCallback | None = None, rpc_timeout_s: float = 10.0,
                 flush_early: Callable[[int], bool] | None = None,
                 idle: Callable[[], bool] | None = None, idle_flush_ms: float = 1.0,
                 send_progress: Callable[[list[dtq_pb2.TaskProgress]], Awaitable[object]]
                 | None = None) -> None:
        self._stub = stub
        self._send_progress = send_progress
        #: lease id -> the handler's last unsent report, sent before that lease's result
        self._progress: dict[str, dtq_pb2.TaskProgress] = {}
        self._flush_s = max(0.0, flush_ms) / 1000.0
        self._idle = idle
        self._idle_flush_s = min(self._flush_s, max(0.0, idle_flush_ms) / 1000.0)
        self._max_items = max(1, min(1000, max_items))
        self._on_done = on_done
        self._flush_early = flush_early
        self._rpc_timeout_s = rpc_timeout_s
        self._acks: deque[dtq_pb2.AckItem] = deque()
        self._fails: deque[dtq_pb2.FailItem] = deque()
        self._sending: set[str] = set()
        self._has_items = asyncio.Event()
        self._flush_now = asyncio.Event()
        self._closing = False
        self._backoff = Backoff(0.1, 5.0)
        self._task: asyncio.Task[None] | None = None
        self._idle_timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Start the background sender on the running loop."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="dtq-reporter")

    def ack(self, lease_id: str, result: bytes,
            progress: dtq_pb2.TaskProgress | None = None) -> None:
        """Queue a successful completion; ``progress``, the handler's last unsent report,
        goes out on a Heartbeat just before it."""
        self._keep_progress(progress)
        self._push(self._acks, dtq_pb2.AckItem(lease_id=lease_id, result=result))

    def fail(self, item: dtq_pb2.FailItem, progress: dtq_pb2.TaskProgress | None = None) -> None:
        """Queue a failure, release or cancellation (``progress`` as for :meth:`ack`)."""
        self._keep_progress(progress)
        self._push(self._fails, item)

    def _keep_progress(self, progress: dtq_pb2.TaskProgress | None) -> None:
        if progress is not None and self._send_progress is not None:
            self._progress[progress.lease_id] = progress

    def pending_ids(self) -> set[str]:
        """Lease ids queued or being sent (still to be extended by heartbeats)."""
        ids = {i.lease_id for i in self._acks}
        ids.update(i.lease_id for i in self._fails)
        return ids | self._sending

    def __len__(self) -> int:
        return len(self._acks) + len(self._fails) + len(self._sending)

    async def close(self, timeout_s: float = 10.0) -> None:
        """Send everything still queued (within ``timeout_s``), then stop.

        Items that could not be sent in time are dropped with a warning; their
        leases will be reclaimed by the gateway (at-least-once).
        """
        self._closing = True
        self._has_items.set()
        self._flush_now.set()
        if self._task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
        except TimeoutError:
            log.warning("dropping unsent results at shutdown", extra={"items": len(self)})
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def abort(self) -> None:
        """Stop the background sender at once, dropping anything unsent."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _push(self, queue: deque[_I], item: _I) -> None:
        queue.append(item)
        self._has_items.set()
        queued = len(self._acks) + len(self._fails)
        if len(queue) >= self._max_items or (
                self._flush_early is not None and self._flush_early(queued)):
            self._flush_now.set()
        elif self._idle_timer is None and self._idle is not None and self._idle():
            self._idle_timer = asyncio.get_running_loop().call_later(
                self._idle_flush_s, self._idle_flush)

    def _idle_flush(self) -> None:
        self._idle_timer = None
        self._flush_now.set()

    async def _run(self) -> None:
        while True:
            if not (self._acks or self._fails):
                if self._closing:
                    return
                self._has_items.clear()
                await self._has_items.wait()
                continue
            if not self._closing and self._flush_s > 0 and not self._flush_now.is_set():
                try:
                    await asyncio.wait_for(self._flush_now.wait(), self._flush_s)
                except TimeoutError:
                    pass
            await self._send_round()

    async def _send_round(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        acks = _take(self._acks, self._max_items)
        fails = _take(self._fails, self._max_items)
        if len(self._acks) < self._max_items and len(self._fails) < self._max_items:
            self._flush_now.clear()
        self._sending = {i.lease_id for i in acks} | {i.lease_id for i in fails}
        try:
            await self._send_reports(acks, fails)
            retry_acks, retry_fails = await asyncio.gather(
                self._send(self._stub.Ack, dtq_pb2.AckRequest, acks),
                self._send(self._stub.Fail, dtq_pb2.FailRequest, fails))
        finally:
            self._sending = set()
        if retry_acks or retry_fails:
            self._acks.extendleft(reversed(retry_acks))
            self._fails.extendleft(reversed(retry_fails))
            delay = self._backoff.next()
            await asyncio.sleep(min(delay, 0.05) if self._closing else delay)
        else:
            self._backoff.reset()

    async def _send_reports(self, acks: Sequence[Item], fails: Sequence[Item]) -> None:
        """Send the round's final progress reports (if any) ahead of its results."""
        reports = [r for r in (self._progress.pop(i.lease_id, None) for i in (*acks, *fails))
                   if r is not None]
        if not reports or self._send_progress is None:
            return
        try:
            await self._send_progress(reports)
        except Exception as exc:  # noqa: BLE001 - a report is best effort; the results go on
            log.warning("final progress reports not sent: %s", exc,
                        extra={"items": len(reports)})

    async def _send(self, method: Callable[..., Awaitable[Any]],
                    request_cls: Callable[..., object], items: list[_I]) -> list[_I]:
        """Send one batch; return the items to retry (empty when done)."""
        if not items:
            return []
        try:
            response = await method(request_cls(items=items), timeout=self._rpc_timeout_s)
        except grpc.aio.AioRpcError as exc:
            err = DtqRpcError.from_rpc_error(exc)
            if err.code in TRANSIENT:
                log.warning("result call failed, will retry: %s", err,
                            extra={"items": len(items)})
                return items
            if len(items) == 1:  # the gateway raised the single item's error as the status
                self._finish(items[0], None, err)
            else:
                log.error("result call refused, dropping %d items: %s", len(items), err)
                for item in items:
                    self._finish(item, None, err)
            return []
        for item, result in zip(items, response.results):
            item_err = (DtqRpcError.from_item_error(result.error) if result.HasField("error")
                        else None)
            self._finish(item, result, item_err)
        return []

    def _finish(self, item: Item, result: dtq_pb2.LeaseResult | None,
                err: DtqRpcError | None) -> None:
        if err is not None:
            if err.reason == "STALE_LEASE":
                log.info("lease no longer current, result dropped",
                         extra={"lease_id": item.lease_id})
            else:
                log.warning("result refused: %s", err, extra={"lease_id": item.lease_id})
        if self._on_done is not None:
            try:
                self._on_done(item, result, err)
            except Exception:
                log.exception("result callback failed")


def _take(queue: deque[_T], n: int) -> list[_T]:
    out: list[_T] = []
    while queue and len(out) < n:
        out.append(queue.popleft())
    return out


__all__: Sequence[str] = ["TRANSIENT", "ResultReporter"]
