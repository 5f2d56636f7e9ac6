"""Fairness across queues (docs/fairness.md): a worker leasing several queues of one
band is served from them in turn, so a small queue is not starved behind another
queue's backlog. In-process gateway, real Redis."""

from __future__ import annotations

from dtq_proto import dtq_pb2 as pb
from tests.support.leasing import LeaseStream


async def fill(broker_stub, queue: str, n: int, priority: int = 5) -> list[str]:
    reply = await broker_stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[
        pb.EnqueueRequest(queue=queue, task_type="t", payload=b"{}", priority=priority)
        for _ in range(n)]))
    return [r.task_id for r in reply.results]


async def serve(broker_stub, stream: LeaseStream, n: int) -> list[pb.LeasedTask]:
    """Take and ack ``n`` tasks one at a time; the tasks in delivery order."""
    got = []
    for _ in range(n):
        t = await stream.next()
        got.append(t)
        await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=t.lease_id)]))
    return got


async def test_small_queue_is_served_in_turn_behind_a_backlog(broker_stub, gateway) -> None:
    """A holds 200 tasks, B 5 (enqueued after), both p5; one worker leases [A, B] one
    task at a time. Round robin predicts A, B, A, B...: B's 5 tasks among the first 10
    deliveries (+2 for a read that started on the other queue); reading A first would
    deliver B's after all 200 of A."""
    await fill(broker_stub, "fa", 200)
    b_ids = await fill(broker_stub, "fb", 5)
    stream = await LeaseStream(broker_stub, "w1", ["fa", "fb"], max_in_flight=1).open()
    try:
        got = await serve(broker_stub, stream, 12)
    finally:
        stream.close()
    assert set(b_ids) <= {t.task_id for t in got}


async def test_turns_keep_bands_strict(broker_stub, gateway) -> None:
    """Round robin is within a band: a p9 task of either queue comes before any p5."""
    await fill(broker_stub, "fa", 20, priority=5)
    await fill(broker_stub, "fb", 20, priority=5)
    high = set(await fill(broker_stub, "fb", 3, priority=9))
    high |= set(await fill(broker_stub, "fa", 3, priority=9))
    stream = await LeaseStream(broker_stub, "w1", ["fa", "fb"], max_in_flight=1).open()
    try:
        got = await serve(broker_stub, stream, 10)
    finally:
        stream.close()
    assert {t.task_id for t in got[:6]} == high
    assert {t.queue for t in got[6:]} == {"fa", "fb"}
