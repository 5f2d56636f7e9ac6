"""Lifecycle rules from other queues' bug reports, through the real gRPC API."""

from __future__ import annotations

from dtq_proto import dtq_pb2 as pb
from tests.support.leasing import LeaseStream, poll


def enq(**kw) -> pb.EnqueueRequest:
    return pb.EnqueueRequest(queue="q", task_type="t", payload=b"{}", **kw)


async def test_expiry_does_not_cancel_the_retry_of_a_started_task(broker_stub):
    """Expiry means "not started by": a task that started before its deadline follows its
    retry policy even when the retry comes due after the deadline (it used to expire in
    the scheduler's move, and attempt 2 never ran)."""
    r = await broker_stub.Enqueue(enq(ttl_ms=1000, max_attempts=3))
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    first = await lease.next()
    failed = await broker_stub.Fail(pb.FailRequest(items=[pb.FailItem(
        lease_id=first.lease_id, error_message="flaky", retry_after_ms=1500)]))
    assert failed.results[0].status == pb.TASK_STATUS_SCHEDULED
    second = await lease.next(timeout_s=5)  # due 1.5 s later, 0.5 s past the deadline
    assert (second.task_id, second.attempt) == (r.task_id, 2)
    await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=second.lease_id)]))
    task = (await broker_stub.GetTask(pb.GetTaskRequest(task_id=r.task_id))).task
    assert task.status == pb.TASK_STATUS_SUCCEEDED
    assert [a.outcome for a in task.attempts] == ["failed", "succeeded"]
    lease.close()


async def test_expiry_still_applies_to_a_task_that_never_started(broker_stub):
    r = await broker_stub.Enqueue(enq(delay_ms=600, ttl_ms=300))
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()

    async def status() -> int:
        return (await broker_stub.GetTask(pb.GetTaskRequest(task_id=r.task_id))).task.status

    assert await poll(status, lambda s: s != pb.TASK_STATUS_SCHEDULED, timeout_s=5) == \
        pb.TASK_STATUS_EXPIRED
    lease.close()
