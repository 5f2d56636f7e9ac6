"""What a worker says about itself at session start reaches ListWorkers."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from dtq_proto import dtq_pb2, dtq_pb2_grpc
from dtq_pyworker import Worker
from tests.worker.helpers import running


async def _workers(gateway) -> list[dtq_pb2.WorkerInfo]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as ch:
        return list((await dtq_pb2_grpc.AdminStub(ch).ListWorkers(
            dtq_pb2.ListWorkersRequest())).workers)


async def _poll_worker(gateway, worker_id: str, timeout_s: float = 10.0) -> dtq_pb2.WorkerInfo:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        found = [w for w in await _workers(gateway) if w.worker_id == worker_id]
        if found and found[0].leasing:
            return found[0]
        assert asyncio.get_running_loop().time() < deadline, "worker never listed as leasing"
        await asyncio.sleep(0.02)


async def test_worker_labels_queues_and_types_reach_list_workers(gateway):
    worker = Worker(["mail", "sms"], f"127.0.0.1:{gateway.port}", worker_id="w-labels",
                    labels={"region": "eu-west", "pool": "blue"}, drain_grace_s=5)

    @worker.task("send")
    def send(payload, ctx):
        return None

    async with running(worker):
        info = await _poll_worker(gateway, "w-labels")
    assert dict(info.labels) == {"region": "eu-west", "pool": "blue"}
    assert list(info.queues) == ["mail", "sms"] and list(info.task_types) == ["send"]


async def test_oversized_labels_are_invalid_argument_naming_labels(gateway, broker_stub):
    call = broker_stub.Lease(dtq_pb2.LeaseRequest(
        worker_id="w-big", queues=["q"], max_in_flight=1, labels={"k": "v" * 300}))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call.read()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "labels" in err.value.details()
    assert all(w.worker_id != "w-big" for w in await _workers(gateway))
