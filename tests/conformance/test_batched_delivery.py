"""Batched delivery (LeaseRequest.max_batch, docs/protocol.md 3.2) in the conformance suite.

Two halves. The first runs against every worker under test, old (one task per stream
message: the raw-stub worker) and new (batches: dtq-pyworker, the Node.js worker): a
burst leased in few messages is still run once per task within max_in_flight. The
second acts as a worker itself on the raw stubs against the gateway under test (so
``DTQ_CONFORMANCE_GATEWAY_CMD`` checks another gateway build too): what the gateway
must send to an old and to a new worker.
"""

from __future__ import annotations

import json
import queue as queue_mod
import threading

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from dtq_proto import dtq_pb2, dtq_pb2_grpc
from tests.conformance.client import ConformanceClient, describe, max_overlap
from tests.conformance.conftest import StartWorker
from tests.conformance.processes import Gateway

pytestmark = pytest.mark.system

S = dtq_pb2.TaskStatus
#: Longest wait for a stream message that must arrive; and the wait that shows none
#: arrives (a bounded receive, not a sleep: it returns at once when one comes).
ARRIVE_S = 10.0
QUIET_S = 0.5


def test_a_burst_is_run_once_per_task_within_max_in_flight(
        start_worker: StartWorker, client: ConformanceClient, queue: str) -> None:
    worker = start_worker(concurrency=4, max_in_flight=8)
    payloads = [{"burst": i} for i in range(40)]
    items = [dtq_pb2.EnqueueRequest(queue=queue, task_type="conf.echo",
                                    payload=json.dumps(p, separators=(",", ":")).encode())
             for p in payloads]
    ids = [r.task_id for r in client.broker.EnqueueBatch(
        dtq_pb2.EnqueueBatchRequest(items=items), timeout=10).results]
    tasks = client.wait_all_terminal(ids, 30)
    for item, task in zip(items, tasks):
        assert task.status == S.TASK_STATUS_SUCCEEDED, describe(task)
        assert task.result == item.payload, describe(task)
        assert [a.outcome for a in task.attempts] == ["succeeded"], describe(task)
        assert task.worker_id == worker.worker_id, describe(task)
    intervals = [(a.started_at_ms, a.finished_at_ms) for t in tasks for a in t.attempts]
    assert max_overlap(intervals) <= 8, intervals


class RawStream:
    """A Lease stream read on a thread, with a heartbeat every interval (a live worker)."""

    def __init__(self, address: str, worker_id: str, queue: str, *, max_in_flight: int,
                 max_batch: int = 0, accept_cancel_notices: bool = False) -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = dtq_pb2_grpc.BrokerStub(self.channel)
        self.worker_id = worker_id
        self.call = self.stub.Lease(dtq_pb2.LeaseRequest(
            worker_id=worker_id, queues=[queue], max_in_flight=max_in_flight,
            max_batch=max_batch, hostname="conformance",
            accept_cancel_notices=accept_cancel_notices), timeout=120)
        self.session = next(self.call).session
        self.messages: queue_mod.Queue = queue_mod.Queue()
        self._stop = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._beat, daemon=True).start()

    def _read(self) -> None:
        try:
            for message in self.call:
                self.messages.put(message)
            self.messages.put("end")  # ended with OK
        except grpc.RpcError as exc:
            self.messages.put(exc)

    def _beat(self) -> None:
        interval_s = self.session.heartbeat_interval_ms / 1000
        while not self._stop.wait(interval_s):
            try:
                self.stub.Heartbeat(dtq_pb2.HeartbeatRequest(worker_id=self.worker_id),
                                    timeout=5)
            except grpc.RpcError:
                return

    def message(self, timeout_s: float = ARRIVE_S) -> dtq_pb2.LeaseResponse | str:
        """The next stream message ("end" once it ended with OK); queue.Empty on time-out."""
        item = self.messages.get(timeout=timeout_s)
        if isinstance(item, Exception):
            raise item
        return item

    def tasks(self, n: int) -> tuple[list[dtq_pb2.LeasedTask], list[tuple[str, int]]]:
        """Read until ``n`` tasks arrived: (the tasks, per message its kind and size)."""
        tasks: list[dtq_pb2.LeasedTask] = []
        shapes: list[tuple[str, int]] = []
        while len(tasks) < n:
            msg = self.message()
            assert msg != "end", f"the stream ended after {len(tasks)} of {n} tasks"
            kind = msg.WhichOneof("kind")
            got = list(msg.batch.tasks) if kind == "batch" else [msg.task]
            shapes.append((kind, len(got)))
            tasks += got
        return tasks, shapes

    def quiet(self) -> bool:
        """True when no message arrives within QUIET_S."""
        try:
            self.message(QUIET_S)
        except queue_mod.Empty:
            return True
        return False

    def close(self) -> None:
        self._stop.set()
        self.call.cancel()
        self.channel.close()


@pytest.fixture
def streams(gateway: Gateway):
    """Factory of RawStreams on the gateway under test (closed at the end)."""
    opened: list[RawStream] = []

    def open_stream(worker_id: str, queue: str, **kwargs) -> RawStream:
        stream = RawStream(gateway.address, worker_id, queue, **kwargs)
        opened.append(stream)
        return stream

    yield open_stream
    for stream in opened:
        stream.close()


def _enqueue(client: ConformanceClient, queue: str, n: int) -> list[str]:
    items = [dtq_pb2.EnqueueRequest(queue=queue, task_type="conf.echo", payload=b'{"n":%d}' % i)
             for i in range(n)]
    return [r.task_id for r in client.broker.EnqueueBatch(
        dtq_pb2.EnqueueBatchRequest(items=items), timeout=10).results]


def test_an_old_worker_gets_one_task_per_message(streams, client: ConformanceClient,
                                                 queue: str) -> None:
    ids = _enqueue(client, queue, 6)
    stream = streams("conf-old", queue, max_in_flight=6)  # max_batch not set
    assert stream.session.max_batch == 0
    tasks, shapes = stream.tasks(6)
    assert shapes == [("task", 1)] * 6
    assert [t.task_id for t in tasks] == ids  # in order


def test_a_batching_worker_gets_at_most_max_batch_per_message_and_max_in_flight_tasks(
        streams, client: ConformanceClient, queue: str) -> None:
    ids = _enqueue(client, queue, 10)
    stream = streams("conf-new", queue, max_in_flight=6, max_batch=4)
    assert stream.session.max_batch == 4
    tasks, shapes = stream.tasks(6)
    assert {kind for kind, _ in shapes} == {"batch"}
    assert all(1 <= n <= 4 for _, n in shapes), shapes
    assert [t.task_id for t in tasks] == ids[:6]
    assert stream.quiet(), "more tasks than max_in_flight were leased"
    stream.stub.Ack(dtq_pb2.AckRequest(items=[dtq_pb2.AckItem(lease_id=tasks[0].lease_id)]),
                    timeout=10)
    more, _ = stream.tasks(1)
    assert more[0].task_id == ids[6]
    assert stream.quiet(), "one ack freed credit for one task, not a batch"


def test_leases_of_one_batch_are_heartbeated_acked_and_failed_one_by_one(
        streams, client: ConformanceClient, queue: str) -> None:
    ids = _enqueue(client, queue, 3)
    stream = streams("conf-items", queue, max_in_flight=3, max_batch=8)
    (a, b, c), _ = stream.tasks(3)
    all_ids = [a.lease_id, b.lease_id, c.lease_id]
    beat = stream.stub.Heartbeat(dtq_pb2.HeartbeatRequest(worker_id="conf-items",
                                                          lease_ids=all_ids), timeout=10)
    assert list(beat.lost_lease_ids) == []
    stream.stub.Ack(dtq_pb2.AckRequest(items=[dtq_pb2.AckItem(lease_id=a.lease_id)]),
                    timeout=10)
    stream.stub.Fail(dtq_pb2.FailRequest(items=[dtq_pb2.FailItem(
        lease_id=b.lease_id, error_class="E", error_message="no", retryable=False)]),
        timeout=10)
    beat = stream.stub.Heartbeat(dtq_pb2.HeartbeatRequest(worker_id="conf-items",
                                                          lease_ids=all_ids), timeout=10)
    assert sorted(beat.lost_lease_ids) == sorted([a.lease_id, b.lease_id])  # c still held
    assert client.get(ids[0]).status == S.TASK_STATUS_SUCCEEDED
    assert client.get(ids[1]).status == S.TASK_STATUS_DEAD_LETTERED
    assert client.get(ids[2]).status == S.TASK_STATUS_ACTIVE


def test_draining_ends_a_batching_stream_after_what_was_sent(
        streams, client: ConformanceClient, queue: str) -> None:
    ids = _enqueue(client, queue, 5)
    stream = streams("conf-drain", queue, max_in_flight=3, max_batch=8)
    tasks, _ = stream.tasks(3)
    stream.stub.Heartbeat(dtq_pb2.HeartbeatRequest(
        worker_id="conf-drain", lease_ids=[t.lease_id for t in tasks], draining=True), timeout=10)
    assert stream.message() == "end"  # OK, and no task after the ones already sent
    released = stream.stub.Fail(dtq_pb2.FailRequest(items=[
        dtq_pb2.FailItem(lease_id=t.lease_id, mode=dtq_pb2.FAIL_MODE_RELEASE) for t in tasks]),
        timeout=10)
    assert [r.status for r in released.results] == [S.TASK_STATUS_QUEUED] * 3
    assert all(client.get(i).status == S.TASK_STATUS_QUEUED for i in ids)


def test_a_cancel_is_pushed_only_to_a_stream_that_accepts_cancel_notices(
        streams, client: ConformanceClient, queue: str) -> None:
    new = streams("conf-cancel-new", queue, max_in_flight=2, max_batch=4,
                  accept_cancel_notices=True)
    _enqueue(client, queue, 2)
    (first, second), _ = new.tasks(2)
    old = streams("conf-cancel-old", queue, max_in_flight=1)  # the new one is full
    client.enqueue(queue, "conf.sleep", {"ms": 1})
    (old_task,), _ = old.tasks(1)

    def notice() -> list[str]:
        msg = new.message()
        assert msg != "end" and msg.WhichOneof("kind") == "cancelled", msg
        return list(msg.cancelled.lease_ids)

    # CancelTask: the notice names the lease id the worker holds, its Fail applies
    assert client.cancel(first.task_id).cancel_requested
    assert notice() == [first.lease_id]
    failed = new.stub.Fail(dtq_pb2.FailRequest(items=[dtq_pb2.FailItem(
        lease_id=first.lease_id, mode=dtq_pb2.FAIL_MODE_CANCELLED)]), timeout=10)
    assert failed.results[0].status == S.TASK_STATUS_CANCELLED
    # CancelTasks flagging running tasks pushes the same notice
    bulk = client.admin.CancelTasks(dtq_pb2.CancelTasksRequest(filter=dtq_pb2.TaskFilter(
        queue=queue, task_type="conf.echo", statuses=[S.TASK_STATUS_ACTIVE])), timeout=10)
    assert bulk.cancel_requested == 1
    assert notice() == [second.lease_id]
    beat = new.stub.Heartbeat(dtq_pb2.HeartbeatRequest(
        worker_id="conf-cancel-new", lease_ids=[second.lease_id]), timeout=10)
    assert list(beat.cancelled_lease_ids) == [second.lease_id]  # the heartbeat still says it
    # a stream that did not ask for notices gets none: its worker hears it by heartbeat
    assert client.cancel(old_task.task_id).cancel_requested
    assert old.quiet(), "a stream that did not accept cancel notices got a message"
    assert new.quiet(), "a notice went to a stream that does not hold the lease"


def test_max_batch_over_256_is_refused_naming_the_field(gateway: Gateway, queue: str) -> None:
    with grpc.insecure_channel(gateway.address) as channel:
        call = dtq_pb2_grpc.BrokerStub(channel).Lease(dtq_pb2.LeaseRequest(
            worker_id="conf-big", queues=[queue], max_in_flight=4, max_batch=257), timeout=10)
        with pytest.raises(grpc.RpcError) as err:
            next(call)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(err.value)
    info = error_details_pb2.ErrorInfo()
    assert status is not None and status.details[0].Unpack(info)
    assert info.metadata["field"] == "max_batch"
