"""Helpers for tests that act as a worker over the raw dtq.v1 stubs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from dtq_proto import dtq_pb2


class LeaseStream:
    """An open Lease call: ``session`` is the first message, ``next()`` the next task.

    ``messages`` lists, per stream message after SessionInfo, how it carried its tasks:
    ``("task", 1)`` or ``("batch", n)`` (``max_batch`` > 1 asks for batches)."""

    def __init__(self, stub, worker_id: str, queues: list[str], max_in_flight: int = 10,
                 task_types: list[str] | None = None, heartbeat: bool = True,
                 concurrency: int = 0, labels: dict[str, str] | None = None,
                 max_batch: int = 0) -> None:
        self.stub = stub
        self.worker_id = worker_id
        self.heartbeat = heartbeat
        self._beater: asyncio.Task | None = None
        self.call = stub.Lease(dtq_pb2.LeaseRequest(
            worker_id=worker_id, queues=queues, max_in_flight=max_in_flight,
            task_types=task_types or [], hostname="test", concurrency=concurrency,
            labels=labels or {}, max_batch=max_batch))
        self.session: dtq_pb2.SessionInfo | None = None
        self.tasks: asyncio.Queue = asyncio.Queue()
        self.messages: list[tuple[str, int]] = []
        self._reader: asyncio.Task | None = None

    async def open(self) -> LeaseStream:
        """Wait for SessionInfo, then read tasks in the background (a cancelled read
        would cancel the whole call, so reads are never timed out directly)."""
        it = self.call.__aiter__()
        first = await asyncio.wait_for(it.__anext__(), 5)
        self.session = first.session

        async def read() -> None:
            try:
                async for msg in it:
                    if msg.HasField("batch"):
                        self.messages.append(("batch", len(msg.batch.tasks)))
                        for task in msg.batch.tasks:
                            self.tasks.put_nowait(task)
                    else:
                        self.messages.append(("task", 1))
                        self.tasks.put_nowait(msg.task)
                self.tasks.put_nowait(None)  # the stream ended with OK
            except grpc.aio.AioRpcError as exc:
                self.tasks.put_nowait(exc)

        self._reader = asyncio.create_task(read())
        if self.heartbeat:
            self._beater = asyncio.create_task(self._beat())
        return self

    async def _beat(self) -> None:
        """Heartbeat every interval with no lease ids, as the protocol requires of a live
        worker (the gateway leases nothing to a worker whose heartbeats stopped); leases
        are not extended, so tests of reclaim still see them expire."""
        interval_s = (self.session.heartbeat_interval_ms or 1000) / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.stub.Heartbeat(dtq_pb2.HeartbeatRequest(worker_id=self.worker_id))
            except grpc.aio.AioRpcError:
                return

    async def next(self, timeout_s: float = 5.0) -> dtq_pb2.LeasedTask:
        """The next leased task (raises TimeoutError when none arrives in time)."""
        item = await asyncio.wait_for(self.tasks.get(), timeout_s)
        if isinstance(item, Exception):
            raise item
        if item is None:
            raise EOFError("the Lease stream ended with OK")
        return item

    async def take(self, n: int, timeout_s: float = 5.0) -> list[dtq_pb2.LeasedTask]:
        """The next ``n`` tasks."""
        return [await self.next(timeout_s) for _ in range(n)]

    def close(self) -> None:
        self.call.cancel()
        if self._beater:
            self._beater.cancel()


def error_reason(err: grpc.aio.AioRpcError) -> str:
    """ErrorInfo.reason from a failed call's grpc-status-details-bin trailer."""
    status = rpc_status.from_call(err)
    if status is None:
        return ""
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info.reason
    return ""


def error_field(err: grpc.aio.AioRpcError) -> str:
    """ErrorInfo.metadata['field'] of a failed call."""
    status = rpc_status.from_call(err)
    for detail in (status.details if status else []):
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info.metadata.get("field", "")
    return ""


async def poll(fn: Callable[[], Awaitable[Any]], pred: Callable[[Any], bool],
               timeout_s: float = 10.0, interval_s: float = 0.02) -> Any:
    """Call ``fn`` until ``pred(result)`` holds; return the result or raise TimeoutError."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await fn()
        if pred(value):
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout_s}s; last value: {value!r}")
        await asyncio.sleep(interval_s)


async def wait_until(predicate: Any, timeout_s: float = 5.0, every_s: float = 0.02) -> Any:
    """Poll an async or sync predicate until truthy; returns its value or fails."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(every_s)


def resign(lease_id: str, keyring=None, **changes) -> str:
    """``lease_id`` with fields replaced (leaseid.Lease field names) and signed again:
    an edit that passes the MAC, to test the scripts' own fencing behind it. Without
    ``keyring`` the per-process one of components built alone (leaseid.default_keyring)."""
    import dataclasses

    from dtq_gateway.leasing import leaseid

    ring = keyring or leaseid.default_keyring()
    lease = leaseid.decode(lease_id, ring)
    return dataclasses.replace(lease, **changes).encode(ring)
