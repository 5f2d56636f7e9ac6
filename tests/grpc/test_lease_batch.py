"""Batched delivery on the Lease stream (LeaseRequest.max_batch), against an in-process
gateway: old workers keep one task per message, new ones get LeasedTaskBatch messages
of at most max_batch tasks, and flow control and fencing stay per task."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.support.leasing import LeaseStream, error_field


def enq(n: int, queue: str = "q") -> pb.EnqueueBatchRequest:
    return pb.EnqueueBatchRequest(items=[
        pb.EnqueueRequest(queue=queue, task_type="t", payload=b'{"n":%d}' % i)
        for i in range(n)])


async def test_a_worker_without_max_batch_gets_one_task_per_message(broker_stub):
    await broker_stub.EnqueueBatch(enq(6))
    lease = await LeaseStream(broker_stub, "w1", ["q"], max_in_flight=6).open()
    assert lease.session.max_batch == 0
    got = await lease.take(6)
    assert len({t.task_id for t in got}) == 6
    assert lease.messages == [("task", 1)] * 6
    lease.close()


async def test_max_batch_one_is_the_original_protocol(broker_stub):
    await broker_stub.EnqueueBatch(enq(3))
    lease = await LeaseStream(broker_stub, "w1", ["q"], max_in_flight=3, max_batch=1).open()
    assert lease.session.max_batch == 0
    await lease.take(3)
    assert lease.messages == [("task", 1)] * 3
    lease.close()


async def test_a_batching_worker_gets_batches_of_at_most_max_batch(broker_stub):
    # the ten tasks wait before the stream opens, so the first read activates them all
    # at once and the stream writes them as several batches of up to four
    await broker_stub.EnqueueBatch(enq(10))
    lease = await LeaseStream(broker_stub, "w1", ["q"], max_in_flight=10, max_batch=4).open()
    assert lease.session.max_batch == 4
    got = await lease.take(10)
    assert [t.payload for t in got] == [b'{"n":%d}' % i for i in range(10)]  # in order
    kinds = {kind for kind, _ in lease.messages}
    sizes = [n for _, n in lease.messages]
    assert kinds == {"batch"}
    assert sum(sizes) == 10 and all(1 <= n <= 4 for n in sizes)
    assert max(sizes) > 1
    lease.close()


@pytest.mark.parametrize("max_batch", [257, 100_000])
async def test_max_batch_over_256_is_refused_naming_the_field(broker_stub, channel,
                                                             max_batch):
    call = broker_stub.Lease(pb.LeaseRequest(worker_id="w1", queues=["fresh"],
                                             max_in_flight=4, max_batch=max_batch))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in call:
            pass
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_field(err.value) == "max_batch"
    admin = dtq_pb2_grpc.AdminStub(channel)
    assert list((await admin.ListWorkers(pb.ListWorkersRequest())).workers) == []


async def test_max_in_flight_counts_tasks_not_messages(broker_stub):
    await broker_stub.EnqueueBatch(enq(6))
    lease = await LeaseStream(broker_stub, "w1", ["q"], max_in_flight=3, max_batch=8).open()
    first = await lease.take(3)
    with pytest.raises(asyncio.TimeoutError):
        await lease.next(timeout_s=0.5)
    await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=first[0].lease_id)]))
    fourth = await lease.next()
    assert fourth.task_id not in {t.task_id for t in first}
    with pytest.raises(asyncio.TimeoutError):
        await lease.next(timeout_s=0.5)  # one ack freed one task of credit, not a batch
    lease.close()


async def test_leases_of_one_batch_are_reported_one_by_one(broker_stub):
    await broker_stub.EnqueueBatch(enq(3))
    lease = await LeaseStream(broker_stub, "w1", ["q"], max_in_flight=3, max_batch=8).open()
    a, b, c = await lease.take(3)
    beat = await broker_stub.Heartbeat(pb.HeartbeatRequest(
        worker_id="w1", lease_ids=[a.lease_id, b.lease_id, c.lease_id]))
    assert list(beat.lost_lease_ids) == []
    acked = await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=a.lease_id)]))
    assert acked.results[0].status == pb.TASK_STATUS_SUCCEEDED
    failed = await broker_stub.Fail(pb.FailRequest(items=[pb.FailItem(
        lease_id=b.lease_id, error_class="E", retryable=False)]))
    assert failed.results[0].status == pb.TASK_STATUS_DEAD_LETTERED
    beat = await broker_stub.Heartbeat(pb.HeartbeatRequest(
        worker_id="w1", lease_ids=[a.lease_id, b.lease_id, c.lease_id]))
    assert set(beat.lost_lease_ids) == {a.lease_id, b.lease_id}  # c is still held
    done = await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=c.lease_id)]))
    assert done.results[0].status == pb.TASK_STATUS_SUCCEEDED
    lease.close()


async def test_draining_ends_a_batching_stream_after_every_sent_lease(broker_stub):
    await broker_stub.EnqueueBatch(enq(5))
    lease = await LeaseStream(broker_stub, "w1", ["q"], max_in_flight=3, max_batch=8).open()
    got = await lease.take(3)
    await broker_stub.Heartbeat(pb.HeartbeatRequest(
        worker_id="w1", lease_ids=[t.lease_id for t in got], draining=True))
    with pytest.raises(EOFError):
        await lease.next()  # ended with OK, nothing after the leases already sent
    res = await broker_stub.Fail(pb.FailRequest(items=[
        pb.FailItem(lease_id=t.lease_id, mode=pb.FAIL_MODE_RELEASE) for t in got]))
    assert [r.status for r in res.results] == [pb.TASK_STATUS_QUEUED] * 3
    lease.close()


async def test_a_batch_carries_at_most_max_payload_bytes_of_tasks(redis_url):
    """A batch never needs a larger receive limit than the largest single task: its
    encoded tasks together stay within DTQ_MAX_PAYLOAD_BYTES (1000 here)."""
    from dtq_gateway.server import Gateway
    from tests.conftest import gateway_settings

    gw = Gateway(gateway_settings(redis_url, max_payload_bytes=1000), redis_url)
    await gw.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
            stub = dtq_pb2_grpc.BrokerStub(ch)
            await stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[
                pb.EnqueueRequest(queue="q", task_type="t", payload=b"x" * 250,
                                  content_type="application/octet-stream")
                for _ in range(6)]))
            lease = await LeaseStream(stub, "w1", ["q"], max_in_flight=6, max_batch=8).open()
            got = await lease.take(6)
            assert all(400 < t.ByteSize() <= 500 for t in got)  # 250 B payload + ids, fields
            sizes = [n for _, n in lease.messages]
            assert sum(sizes) == 6 and max(sizes) == 2, sizes  # 2 x <=500 fits, 3 x >400 not
            lease.close()
    finally:
        await gw.stop()


async def test_a_batch_of_metadata_heavy_tasks_needs_no_larger_receive_limit(redis_url):
    """The batch bound counts whole tasks, not payloads alone: tasks of tiny payloads
    and 8 KiB of metadata each (DTQ_MAX_PAYLOAD_BYTES 4096) reach a worker whose
    receive limit fits one such task, one per message, instead of a batch of all six
    that the worker's gRPC refuses (RESOURCE_EXHAUSTED), which would leave them to
    expire and spend attempts."""
    from dtq_gateway.server import Gateway
    from tests.conftest import gateway_settings

    gw = Gateway(gateway_settings(redis_url, max_payload_bytes=4096), redis_url)
    await gw.start()
    metadata = {f"k{j}": "v" * 1024 for j in range(8)}
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as producer:
            await dtq_pb2_grpc.BrokerStub(producer).EnqueueBatch(pb.EnqueueBatchRequest(
                items=[pb.EnqueueRequest(queue="q", task_type="t", payload=b"{}",
                                         metadata=metadata) for _ in range(6)]))
        options = [("grpc.max_receive_message_length", 16 * 1024)]  # one task fits
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}", options=options) as ch:
            lease = await LeaseStream(dtq_pb2_grpc.BrokerStub(ch), "w1", ["q"],
                                      max_in_flight=6, max_batch=8, concurrency=6).open()
            got = await lease.take(6)
            assert len({t.task_id for t in got}) == 6
            assert lease.messages == [("batch", 1)] * 6
            lease.close()
    finally:
        await gw.stop()
