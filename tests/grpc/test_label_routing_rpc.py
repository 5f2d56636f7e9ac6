"""Label routing (docs/fairness.md): a task with required labels is leased only by a
session whose LeaseRequest.labels contain them all; other sessions put it back without
being held up by it, and while no live worker can take it GetQueueStats says so."""

from __future__ import annotations

import grpc
import pytest

from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.support.leasing import LeaseStream, error_field, poll

Q = "lb"
GPU = {"gpu": "a100"}


@pytest.fixture
def admin(channel):
    return dtq_pb2_grpc.AdminStub(channel)


async def enqueue(broker_stub, n: int, labels: dict[str, str] | None = None) -> list[str]:
    reply = await broker_stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[
        pb.EnqueueRequest(queue=Q, task_type="t", payload=b"{}", required_labels=labels or {})
        for _ in range(n)]))
    return [r.task_id for r in reply.results]


async def ack(broker_stub, tasks) -> None:
    await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=t.lease_id) for t in tasks]))


async def test_labelled_tasks_wait_for_a_matching_worker_without_blocking_others(
        admin, broker_stub, gateway) -> None:
    gpu_ids = set(await enqueue(broker_stub, 30, GPU))
    one = await broker_stub.GetTask(pb.GetTaskRequest(task_id=next(iter(gpu_ids))))
    assert dict(one.task.required_labels) == GPU
    plain_ids = set(await enqueue(broker_stub, 5))
    plain = await LeaseStream(broker_stub, "w-plain", [Q], max_in_flight=5,
                              labels={"zone": "eu"}).open()
    try:
        got = await plain.take(5, timeout_s=10)  # behind 30 tasks it cannot take
        assert {t.task_id for t in got} == plain_ids
        await ack(broker_stub, got)

        async def stats() -> pb.GetQueueStatsResponse:
            return await admin.GetQueueStats(pb.GetQueueStatsRequest(queue=Q))

        s = await poll(stats, lambda s: s.stuck_task_types == ["t"])
        (row,) = [w for w in s.waiting_types if dict(w.required_labels) == GPU]
        assert not row.taken
        assert 25 <= row.waiting <= 30  # the plain session's latest read may hold 5 briefly
        gpu = await LeaseStream(broker_stub, "w-gpu", [Q], max_in_flight=5,
                                labels={**GPU, "zone": "us"}).open()
        try:
            first = await gpu.take(5)
            assert {t.task_id for t in first} <= gpu_ids
            s = await stats()
            assert s.stuck_task_types == []
            (row,) = [w for w in s.waiting_types if dict(w.required_labels) == GPU]
            assert row.taken
            await ack(broker_stub, first)
            rest = []
            while len(rest) < 25:
                t = await gpu.next()
                rest.append(t)
                await ack(broker_stub, [t])
            assert {t.task_id for t in first + rest} == gpu_ids
        finally:
            gpu.close()
    finally:
        plain.close()


@pytest.mark.parametrize("labels", [
    {f"k{i}": "v" for i in range(33)}, {"": "v"}, {"k" * 65: "v"}, {"k": "v" * 257}])
async def test_bad_required_labels_name_the_field(broker_stub, gateway, labels) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await broker_stub.Enqueue(pb.EnqueueRequest(queue=Q, task_type="t",
                                                    required_labels=labels))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_field(err.value) == "required_labels"
    assert not await gateway.redis.keys("dtq:task:*")
