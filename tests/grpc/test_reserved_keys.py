"""dtq's own deduplication keys are out of a client's reach (issue 23, items 1 and 2).

A schedule fire, a chain step and a group callback are enqueued with the keys
``schedule:<name>:<fire ms>``, ``chain:<A id>`` and ``group:<group id>``. A producer that
sends the same text as its own idempotency key gets an ordinary task of its own: the
internal record is hashed apart (keys.internal_idempotency_digest), so the fire, the
step and the callback still run, and nothing names a task that does not exist.
"""

from __future__ import annotations

import pytest

from dtq_gateway.domain.followup_plan import callback_task_id, step_task_id
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.support.leasing import LeaseStream, poll


def enq(queue="q", task_type="t", payload=b"{}", **kw) -> pb.EnqueueRequest:
    return pb.EnqueueRequest(queue=queue, task_type=task_type, payload=payload, **kw)


async def get(stub, task_id: str) -> pb.Task:
    return (await stub.GetTask(pb.GetTaskRequest(task_id=task_id))).task


async def ack_all(stub, tasks) -> None:
    await stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=t.lease_id) for t in tasks]))


@pytest.fixture
def admin(channel):
    return dtq_pb2_grpc.AdminStub(channel)


async def test_a_producer_cannot_take_over_a_schedule_fire(admin, broker_stub) -> None:
    created = await admin.CreateSchedule(pb.CreateScheduleRequest(schedule=pb.Schedule(
        name="nightly", interval_ms=2000, task=enq(queue="sched", task_type="admin.job"))))
    fire_ms = created.schedule.next_fire_ms
    planted = await broker_stub.Enqueue(enq(queue="sched", task_type="evil",
                                            idempotency_key=f"schedule:nightly:{fire_ms}"))
    assert not planted.deduplicated
    info = await poll(lambda: admin.GetSchedule(pb.GetScheduleRequest(name="nightly")),
                      lambda r: r.schedule.fires_total >= 1, timeout_s=20)
    assert info.schedule.last_fire_ms == fire_ms
    fired = await get(broker_stub, info.schedule.last_task_id)
    assert fired.task_id != planted.task_id, "the fire was deduplicated onto the producer's task"
    assert (fired.task_type, fired.metadata["dtq.fire_ms"]) == ("admin.job", str(fire_ms))
    assert (await get(broker_stub, planted.task_id)).task_type == "evil"


async def test_a_planted_chain_key_does_not_drop_the_step(broker_stub) -> None:
    r = await broker_stub.Enqueue(enq(chain=[enq(queue="q2", task_type="step-b")]))
    step_id = step_task_id(r.task_id, "q2")
    planted = await broker_stub.Enqueue(enq(queue="q2", task_type="evil",
                                            idempotency_key=f"chain:{r.task_id}"))
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    await ack_all(broker_stub, [await lease.next()])
    lease.close()
    a = await poll(lambda: get(broker_stub, r.task_id),
                   lambda t: t.chain_state == pb.CHAIN_STATE_CONTINUED, timeout_s=10)
    assert a.next_task_id == step_id
    step = await get(broker_stub, a.next_task_id)  # NOT_FOUND before the fix
    assert (step.task_type, step.queue) == ("step-b", "q2")
    assert step.task_id != planted.task_id


async def test_a_planted_group_key_does_not_drop_the_callback(broker_stub) -> None:
    resp = await broker_stub.EnqueueBatch(pb.EnqueueBatchRequest(
        items=[enq(task_type="m0"), enq(task_type="m1")],
        group_callback=enq(queue="cb", task_type="summary", payload=b"")))
    cb_id = callback_task_id(resp.group_id, "cb")
    planted = await broker_stub.Enqueue(enq(queue="cb", task_type="evil",
                                            idempotency_key=f"group:{resp.group_id}"))
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    await ack_all(broker_stub, await lease.take(2))
    lease.close()
    lease = await LeaseStream(broker_stub, "w2", ["cb"]).open()
    seen = {t.task_id: t for t in await lease.take(2, timeout_s=10)}
    lease.close()
    assert set(seen) == {cb_id, planted.task_id}, "the callback was dropped"
    assert seen[cb_id].task_type == "summary"
    assert seen[cb_id].metadata["dtq.group_id"] == resp.group_id


async def test_a_lease_naming_the_text_digest_of_an_internal_key_is_stale(broker_stub, gateway):
    """What an older gateway (before internal keys were hashed apart) makes of a chain
    step: it names the record by the plain digest of ``chain:<A id>``. That lease does
    not match the step's record, so its Ack is refused as stale (redis-layout.md,
    "Changing the layout"), and the lease the gateway issued is still good."""
    import grpc

    from dtq_gateway.store import keys
    from tests.support.leasing import error_reason, resign

    r = await broker_stub.Enqueue(enq(chain=[enq(task_type="step-b")]))
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    await ack_all(broker_stub, [await lease.next()])
    step = await lease.next(timeout_s=10)
    assert step.task_id == step_task_id(r.task_id, "q")
    old_style = resign(step.lease_id, gateway.keyring,
                       idem_digest=keys.idempotency_digest(f"chain:{r.task_id}"))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=old_style)]))
    assert (err.value.code(), error_reason(err.value)) == \
        (grpc.StatusCode.FAILED_PRECONDITION, "STALE_LEASE")
    await ack_all(broker_stub, [step])
    assert (await get(broker_stub, step.task_id)).status == pb.TASK_STATUS_SUCCEEDED
    lease.close()
