"""An in-memory Broker servicer for testing dtq_pyworker without Redis.

It behaves like the gateway where the worker can tell: a Lease stream starts
with SessionInfo and then delivers pushed tasks while the worker holds fewer
than max_in_flight unfinished leases; Heartbeat reports leases marked lost or
cancelled; Ack/Fail answer per item (STALE_LEASE for leases marked stale, and
FAILED_PRECONDITION as the call status when the request has one item; duplicate=true
for leases marked so). It
records every call so tests can assert on them, and tests wait on
:meth:`FakeBroker.wait_for` (a condition notified on every change).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import uuid
from collections import deque
from collections.abc import Callable

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from dtq_proto import dtq_pb2, dtq_pb2_grpc

FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION.value[0]


def _status(code: grpc.StatusCode, reason: str, message: str, field: str = ""):
    info = error_details_pb2.ErrorInfo(reason=reason, domain="dtq.v1")
    if field:
        info.metadata["field"] = field
    packed = any_pb2.Any()
    packed.Pack(info)
    return rpc_status.to_status(status_pb2.Status(code=code.value[0], message=message,
                                                  details=[packed]))


class FakeBroker(dtq_pb2_grpc.BrokerServicer):
    """In-memory Broker. Create and use it on the loop that serves it.

    Args:
        heartbeat_interval_ms: Interval announced in SessionInfo, in ms.
        grant_max_in_flight: Cap on the granted max_in_flight (0 = as requested).
    """

    def __init__(self, heartbeat_interval_ms: int = 50, grant_max_in_flight: int = 0) -> None:
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.grant_max_in_flight = grant_max_in_flight
        self.cond = asyncio.Condition()
        self.to_lease: deque[dtq_pb2.LeasedTask] = deque()
        self.delivered: list[dtq_pb2.LeasedTask] = []
        self.outstanding: set[str] = set()
        self.max_outstanding = 0
        self.lease_requests: list[dtq_pb2.LeaseRequest] = []
        self.open_streams = 0
        self.heartbeats: list[dtq_pb2.HeartbeatRequest] = []
        self.ack_calls: list[list[dtq_pb2.AckItem]] = []
        self.fail_calls: list[list[dtq_pb2.FailItem]] = []
        self.lost: set[str] = set()
        self.cancelled: set[str] = set()
        self.stale: set[str] = set()
        #: Leases whose Ack/Fail is answered duplicate=true with this task status (as the
        #: gateway answers the resend of an item it applied, whose reply was lost).
        self.duplicates: dict[str, int] = {}
        self.unavailable_results = 0  # fail this many Ack/Fail calls with UNAVAILABLE
        self.unavailable_heartbeats = 0  # fail this many Heartbeat calls with UNAVAILABLE
        self.failed_heartbeats = 0
        self.tasks: dict[str, dtq_pb2.Task] = {}
        self.get_task_calls = 0
        #: refuse Lease with it: (code, reason) or (code, reason, message, field)
        self.lease_error: tuple | None = None
        self.metadata: list[dict[str, str]] = []  # call metadata of Lease and Enqueue calls
        self._abort_epoch = 0
        #: Answer draining heartbeats like the gateway: deliver nothing more to that
        #: worker and end its streams with OK (False: an older gateway ignoring it).
        self.honor_draining = True
        self.draining_workers: set[str] = set()
        #: Tasks "in transit" when a draining heartbeat arrives: written to the stream
        #: before it ends, whatever the credit (as a gateway that had sent them already).
        self.in_transit: deque[dtq_pb2.LeasedTask] = deque()
        #: Honour LeaseRequest.max_batch > 1 (LeasedTaskBatch messages of the tasks
        #: ready, within the credit); False: an older gateway, one task per message.
        self.batch_delivery = True
        #: Tasks per stream message sent, in order (a LeaseResponse.task counts as 1).
        self.message_sizes: list[int] = []
        self._ids = itertools.count(1)

    # -- test helpers ---------------------------------------------------------------
    async def push(self, task_type: str, payload: bytes = b"{}", *,
                   content_type: str = "application/json", timeout_ms: int = 0,
                   attempt: int = 1, metadata: dict[str, str] | None = None) -> str:
        """Make a task available to Lease streams; return its lease id."""
        n = next(self._ids)
        task = dtq_pb2.LeasedTask(
            lease_id=f"lease-{n}", task_id=uuid.uuid4().hex, queue="q", task_type=task_type,
            payload=payload, content_type=content_type, priority=5, attempt=attempt,
            max_attempts=3, timeout_ms=timeout_ms, metadata=metadata or {})
        self.to_lease.append(task)
        await self.notify()
        return task.lease_id

    def in_transit_task(self, task_type: str, payload: bytes = b"{}") -> str:
        """Queue a task written to the stream only once the worker drains; its lease id."""
        n = next(self._ids)
        task = dtq_pb2.LeasedTask(
            lease_id=f"lease-{n}", task_id=uuid.uuid4().hex, queue="q", task_type=task_type,
            payload=payload, content_type="application/json", priority=5, attempt=1,
            max_attempts=3)
        self.in_transit.append(task)
        return task.lease_id

    async def notify(self) -> None:
        """Wake every waiter (call after changing state from a test)."""
        async with self.cond:
            self.cond.notify_all()

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
        """Wait until ``predicate()`` holds (re-checked on every change)."""
        async with self.cond:
            await asyncio.wait_for(self.cond.wait_for(predicate), timeout_s)

    async def abort_streams(self) -> None:
        """End every open Lease stream with UNAVAILABLE (as a draining gateway)."""
        self._abort_epoch += 1
        await self.notify()

    def acked(self) -> dict[str, bytes]:
        """Successful Ack items by lease id."""
        return {i.lease_id: i.result for call in self.ack_calls for i in call
                if i.lease_id not in self.stale}

    def failed(self) -> dict[str, dtq_pb2.FailItem]:
        """Fail items by lease id (last one wins)."""
        return {i.lease_id: i for call in self.fail_calls for i in call}

    def reported(self) -> set[str]:
        """Lease ids that were acked or failed."""
        return set(self.acked()) | set(self.failed())

    # -- Broker RPCs --------------------------------------------------------------------
    async def Lease(self, request, context):
        self.lease_requests.append(request)
        self.metadata.append(dict(context.invocation_metadata() or ()))
        if self.lease_error is not None:
            await self.notify()
            code, reason, *rest = self.lease_error
            await context.abort_with_status(_status(code, reason, *(rest or ["refused"])))
        granted = request.max_in_flight
        if self.grant_max_in_flight:
            granted = min(granted, self.grant_max_in_flight)
        epoch = self._abort_epoch
        max_batch = request.max_batch if request.max_batch > 1 and self.batch_delivery else 0
        yield dtq_pb2.LeaseResponse(session=dtq_pb2.SessionInfo(
            session_id=uuid.uuid4().hex, heartbeat_interval_ms=self.heartbeat_interval_ms,
            visibility_timeout_ms=self.heartbeat_interval_ms * 6, max_in_flight=granted,
            gateway_id="fake", result_max_bytes=1 << 20, lease_grace_ms=1000,
            max_batch=max_batch))
        self.open_streams += 1
        await self.notify()
        try:
            while True:
                async with self.cond:
                    await self.cond.wait_for(lambda: self._abort_epoch != epoch or (
                        request.worker_id in self.draining_workers) or (
                        self.to_lease and len(self.outstanding) < granted))
                    if self._abort_epoch != epoch:
                        await context.abort(grpc.StatusCode.UNAVAILABLE, "gateway draining")
                    if request.worker_id in self.draining_workers:
                        break
                    tasks = []
                    while self.to_lease and len(self.outstanding) < granted and (
                            len(tasks) < max(1, max_batch)):
                        task = self.to_lease.popleft()
                        self.outstanding.add(task.lease_id)
                        tasks.append(task)
                    self.max_outstanding = max(self.max_outstanding, len(self.outstanding))
                    self.delivered.extend(tasks)
                    self.message_sizes.append(len(tasks))
                    self.cond.notify_all()
                yield (dtq_pb2.LeaseResponse(batch=dtq_pb2.LeasedTaskBatch(tasks=tasks))
                       if max_batch else dtq_pb2.LeaseResponse(task=tasks[0]))
            while self.in_transit:  # the worker drains: what was sent, then OK
                task = self.in_transit.popleft()
                self.outstanding.add(task.lease_id)
                self.delivered.append(task)
                await self.notify()
                yield dtq_pb2.LeaseResponse(task=task)
        finally:
            self.open_streams -= 1
            await self.notify()

    async def Heartbeat(self, request, context):
        if self.unavailable_heartbeats > 0:
            self.unavailable_heartbeats -= 1
            self.failed_heartbeats += 1
            await self.notify()
            await context.abort(grpc.StatusCode.UNAVAILABLE, "redis unreachable")
        self.heartbeats.append(request)
        if request.draining and self.honor_draining:
            self.draining_workers.add(request.worker_id)
        ids = set(request.lease_ids)
        lost = sorted(ids & self.lost)
        self.outstanding -= set(lost)
        await self.notify()
        return dtq_pb2.HeartbeatResponse(
            lost_lease_ids=lost, cancelled_lease_ids=sorted(ids & self.cancelled),
            heartbeat_interval_ms=self.heartbeat_interval_ms)

    async def Ack(self, request, context):
        items = list(request.items)
        return dtq_pb2.AckResponse(results=await self._answer(
            items, context, self.ack_calls, lambda _i: dtq_pb2.TASK_STATUS_SUCCEEDED))

    async def Fail(self, request, context):
        items = list(request.items)
        return dtq_pb2.FailResponse(results=await self._answer(
            items, context, self.fail_calls, _status_after_fail))

    async def _answer(self, items, context, calls, status_of):
        if self.unavailable_results > 0:
            self.unavailable_results -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "redis unreachable")
        calls.append(items)
        results = []
        for item in items:
            if item.lease_id in self.stale:
                results.append(dtq_pb2.LeaseResult(lease_id=item.lease_id, error=dtq_pb2.ItemError(
                    code=FAILED_PRECONDITION, reason="STALE_LEASE", message="stale lease")))
                continue
            self.outstanding.discard(item.lease_id)
            if item.lease_id in self.duplicates:
                results.append(dtq_pb2.LeaseResult(lease_id=item.lease_id, duplicate=True,
                                                   status=self.duplicates[item.lease_id]))
                continue
            results.append(dtq_pb2.LeaseResult(lease_id=item.lease_id, status=status_of(item)))
        await self.notify()
        if len(items) == 1 and results[0].HasField("error"):
            await context.abort_with_status(_status(
                grpc.StatusCode.FAILED_PRECONDITION, "STALE_LEASE", "stale lease"))
        return results

    async def Enqueue(self, request, context):
        self.metadata.append(dict(context.invocation_metadata() or ()))
        if not request.queue:
            await context.abort_with_status(_status(
                grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", "queue is required", "queue"))
        return self._store(request)

    async def EnqueueBatch(self, request, context):
        results = []
        for item in request.items:
            if not item.queue:
                results.append(dtq_pb2.EnqueueBatchResult(error=dtq_pb2.ItemError(
                    code=grpc.StatusCode.INVALID_ARGUMENT.value[0], reason="INVALID_FIELD",
                    message="queue is required", field="queue")))
                continue
            r = self._store(item)
            results.append(dtq_pb2.EnqueueBatchResult(task_id=r.task_id, status=r.status))
        return dtq_pb2.EnqueueBatchResponse(results=results)

    def _store(self, request) -> dtq_pb2.EnqueueResponse:
        for task in self.tasks.values():
            if request.idempotency_key and task.idempotency_key == request.idempotency_key:
                return dtq_pb2.EnqueueResponse(task_id=task.task_id, deduplicated=True,
                                               status=task.status)
        task = dtq_pb2.Task(
            task_id=uuid.uuid4().hex, queue=request.queue, task_type=request.task_type,
            payload=request.payload, content_type=request.content_type,
            priority=request.priority if request.HasField("priority") else 5,
            status=dtq_pb2.TASK_STATUS_QUEUED, attempt=1,
            max_attempts=request.max_attempts or 3, timeout_ms=request.timeout_ms or 60000,
            idempotency_key=request.idempotency_key, metadata=request.metadata)
        self.tasks[task.task_id] = task
        return dtq_pb2.EnqueueResponse(task_id=task.task_id, status=task.status)

    async def GetTask(self, request, context):
        self.get_task_calls += 1
        await self.notify()
        task = self.tasks.get(request.task_id)
        if task is None:
            await context.abort_with_status(_status(
                grpc.StatusCode.NOT_FOUND, "NOT_FOUND", "unknown task"))
        return dtq_pb2.GetTaskResponse(task=task)

    async def CancelTask(self, request, context):
        task = self.tasks.get(request.task_id)
        if task is None:
            await context.abort_with_status(_status(
                grpc.StatusCode.NOT_FOUND, "NOT_FOUND", "unknown task"))
        task.status = dtq_pb2.TASK_STATUS_CANCELLED
        return dtq_pb2.CancelTaskResponse(status=task.status, request_id="r1")


def _status_after_fail(item: dtq_pb2.FailItem) -> int:
    if item.mode == dtq_pb2.FAIL_MODE_RELEASE:
        return dtq_pb2.TASK_STATUS_QUEUED
    if item.mode == dtq_pb2.FAIL_MODE_CANCELLED:
        return dtq_pb2.TASK_STATUS_CANCELLED
    retryable = item.retryable if item.HasField("retryable") else True
    return dtq_pb2.TASK_STATUS_SCHEDULED if retryable else dtq_pb2.TASK_STATUS_DEAD_LETTERED


async def start_server(broker: FakeBroker, port: int = 0,
                       credentials: grpc.ServerCredentials | None = None,
                       ) -> tuple[grpc.aio.Server, str]:
    """Serve ``broker`` on 127.0.0.1:``port`` (0 = a free one, TLS with ``credentials``);
    return (server, "host:port")."""
    server = grpc.aio.server()
    dtq_pb2_grpc.add_BrokerServicer_to_server(broker, server)
    if credentials is None:
        port = server.add_insecure_port(f"127.0.0.1:{port}")
    else:
        port = server.add_secure_port(f"127.0.0.1:{port}", credentials)
    await server.start()
    return server, f"127.0.0.1:{port}"


class ThreadedFakeBroker:
    """A FakeBroker served from its own thread and loop (for blocking clients)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.broker, self.server, self.target = self.call(self._start())

    async def _start(self):
        broker = FakeBroker()
        server, target = await start_server(broker)
        return broker, server, target

    def call(self, coro, timeout_s: float = 10.0):
        """Run ``coro`` on the broker's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        """Stop the server and the thread."""
        self.call(self.server.stop(None))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()
