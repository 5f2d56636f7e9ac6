"""Admin operations on state made by the real data path (Broker RPCs + scripts).

Enqueue, lease and fail go through the in-process gateway; the admin domain
functions then act on what the Broker's scripts wrote, and the Broker must lease
the result again. This checks that both sides agree on the Redis layout.
"""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from dtq_gateway.store import admin, admin_dlq, keys
from dtq_proto import dtq_pb2 as pb
from tests.support.leasing import LeaseStream

CALL = admin.CallInfo(actor="ops", request_id="rq")
CFG = admin_dlq.DlqSettings()


@pytest.fixture
async def r(redis_url: str):
    client = aioredis.from_url(redis_url)
    yield client
    await client.aclose()


async def dead_lettered_task(broker_stub) -> str:
    enq = await broker_stub.Enqueue(pb.EnqueueRequest(queue="dq", task_type="t", payload=b"{}",
                                                      max_attempts=1, priority=4))
    lease = await LeaseStream(broker_stub, "w1", ["dq"]).open()
    task = await lease.next()
    await broker_stub.Fail(pb.FailRequest(items=[pb.FailItem(
        lease_id=task.lease_id, error_message="boom", error_class="Boom")]))
    lease.close()
    got = (await broker_stub.GetTask(pb.GetTaskRequest(task_id=enq.task_id))).task
    assert got.status == pb.TASK_STATUS_DEAD_LETTERED
    return enq.task_id


async def test_requeued_dead_letter_is_leased_and_acked(broker_stub, r) -> None:
    task_id = await dead_lettered_task(broker_stub)
    entries, _ = await admin_dlq.list_dead_letters(r, 10)
    assert [admin.text(e.fields["task_id"]) for e in entries] == [task_id]
    await admin_dlq.requeue(r, task_id, CALL, CFG)
    lease = await LeaseStream(broker_stub, "w2", ["dq"]).open()
    again = await lease.next()
    assert (again.task_id, again.attempt, again.priority) == (task_id, 1, 4)
    ack = await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=again.lease_id)]))
    assert ack.results[0].status == pb.TASK_STATUS_SUCCEEDED
    lease.close()
    got = (await broker_stub.GetTask(pb.GetTaskRequest(task_id=task_id))).task
    assert [(a.attempt, a.outcome) for a in got.attempts] == [(1, "failed"), (1, "succeeded")]
    assert got.metadata["requeues"] == "1"


async def test_discarded_dead_letter_reads_back_through_get_task(broker_stub, r) -> None:
    task_id = await dead_lettered_task(broker_stub)
    await admin_dlq.discard(r, task_id, CALL, CFG)
    got = (await broker_stub.GetTask(pb.GetTaskRequest(task_id=task_id))).task
    assert got.status == pb.TASK_STATUS_DEAD_LETTERED
    assert got.metadata.get("discarded") == "true"
    assert await r.xlen(keys.dead_letter("dq")) == 0


async def test_paused_queue_leases_nothing_until_resumed(broker_stub, r) -> None:
    assert await admin.set_paused(r, "pq", True, CALL, create=True)
    await broker_stub.Enqueue(pb.EnqueueRequest(queue="pq", task_type="t", payload=b"{}"))
    lease = await LeaseStream(broker_stub, "w1", ["pq"]).open()
    with pytest.raises(TimeoutError):
        await lease.next(timeout_s=0.5)
    stats = await admin.queue_stats(r, "pq")
    assert (stats.paused, stats.depth, stats.pending) == (True, 1, 0)
    assert stats.oldest_task_age_ms >= 0
    assert await admin.set_paused(r, "pq", False, CALL)
    task = await lease.next(timeout_s=5)
    assert task.queue == "pq"
    lease.close()
