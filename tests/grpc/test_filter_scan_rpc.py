"""A session with little credit behind a long run of tasks it does not take (required
labels it lacks, task types it does not name) still gets the tasks behind them within
seconds: one lease_take scans past up to 256 unwanted entries (docs/fairness.md)."""

from __future__ import annotations

import time

import pytest

from dtq_proto import dtq_pb2 as pb
from tests.support.leasing import LeaseStream

Q = "scan"
GPU = {"gpu": "a100"}


async def enqueue(broker_stub, n: int, task_type: str, labels: dict[str, str]) -> list[str]:
    reply = await broker_stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[
        pb.EnqueueRequest(queue=Q, task_type=task_type, payload=b"{}",
                          required_labels=labels) for _ in range(n)]))
    return [r.task_id for r in reply.results]


@pytest.mark.parametrize("filter_by", ["required labels", "task_types"])
async def test_max_in_flight_1_gets_past_300_unwanted_tasks_within_seconds(
        broker_stub, gateway, filter_by) -> None:
    labelled = filter_by == "required labels"
    await enqueue(broker_stub, 300, "gpu.job", GPU if labelled else {})
    plain_ids = await enqueue(broker_stub, 5, "plain", {})
    stream = await LeaseStream(broker_stub, "w-plain", [Q], max_in_flight=1,
                               task_types=None if labelled else ["plain"]).open()
    try:
        deadline = time.monotonic() + 8  # before the fix: ~60 s (5 reads/s)
        got = []
        while len(got) < 5:
            task = await stream.next(timeout_s=max(0.01, deadline - time.monotonic()))
            got.append(task.task_id)
            await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=task.lease_id)]))
        assert got == plain_ids
    finally:
        stream.close()
