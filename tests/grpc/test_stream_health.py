"""Stream health: a Lease stream that stops reading, and one that reads slowly.

A real redis-server (the session's) and an in-process gateway with fast timings. The
"frozen" worker opens its Lease call and never reads it (as behind a frozen proxy: the
connection answers pings, the stream's HTTP/2 window fills), while it heartbeats on
another connection; a healthy Python worker runs beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
import pytest
from prometheus_client import REGISTRY

from dtq_gateway.server import Gateway
from dtq_proto import dtq_pb2, dtq_pb2_grpc
from dtq_pyworker import Worker
from tests.conftest import gateway_settings
from tests.support.leasing import error_reason
from tests.worker.helpers import poll_until, running

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

#: Timings of these tests: heartbeats every HB_S, leases expire after VT_S.
HB_S = 1.0
VT_S = 20.0
#: Unread window of a stream that says concurrency 1: max(2 x 1, 4) (Session.window).
WINDOW = 4


def _metric(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def _heartbeats(stub, worker_id: str, held: set[str], interval_s: float) -> None:
    """Heartbeat every ``interval_s`` with the leases in ``held`` (as a worker must)."""
    while True:
        with contextlib.suppress(grpc.aio.AioRpcError):
            await stub.Heartbeat(dtq_pb2.HeartbeatRequest(
                worker_id=worker_id, hostname="test", lease_ids=sorted(held)))
        await asyncio.sleep(interval_s)


async def _enqueue(stub, queue: str, n: int, max_attempts: int) -> list[str]:
    ids = []
    for i in range(n):
        reply = await stub.Enqueue(dtq_pb2.EnqueueRequest(
            queue=queue, task_type="t", payload=b'{"i": %d}' % i, max_attempts=max_attempts))
        ids.append(reply.task_id)
    return ids


async def _tasks(stub, ids: list[str]) -> list[dtq_pb2.Task]:
    return [(await stub.GetTask(dtq_pb2.GetTaskRequest(task_id=i))).task for i in ids]


async def test_a_black_holed_lease_stream_hands_its_tasks_to_a_healthy_worker(redis_url):
    gw = Gateway(gateway_settings(redis_url, heartbeat_interval_s=HB_S,
                                  visibility_timeout_s=VT_S), redis_url)
    await gw.start()
    target = f"127.0.0.1:{gw.port}"
    lease_channel = grpc.aio.insecure_channel(target)
    beat_channel = grpc.aio.insecure_channel(target)
    frozen = dtq_pb2_grpc.BrokerStub(lease_channel)
    beats = asyncio.create_task(
        _heartbeats(dtq_pb2_grpc.BrokerStub(beat_channel), "w-frozen", set(), HB_S))
    released_before = _metric("dtq_leases_released_unread_total")
    worker = Worker(["bh"], target, worker_id="w-healthy", concurrency=2, drain_grace_s=2)
    worker.register("t", lambda payload, ctx: "done")
    try:
        # the frozen worker: it gets its SessionInfo, then reads nothing more
        call = frozen.Lease(dtq_pb2.LeaseRequest(worker_id="w-frozen", queues=["bh"],
                                                 max_in_flight=50, concurrency=1,
                                                 hostname="frozen"))
        it = call.__aiter__()
        await asyncio.wait_for(it.__anext__(), 10)
        async with running(worker):
            stub = dtq_pb2_grpc.BrokerStub(beat_channel)
            admin = dtq_pb2_grpc.AdminStub(beat_channel)
            await poll_until(lambda: len(gw.dispatcher.sessions) == 2, 10)
            started = time.monotonic()
            ids = await _enqueue(stub, "bh", 40, max_attempts=1)

            async def all_done() -> bool:
                tasks = await _tasks(stub, ids)
                return all(t.status == dtq_pb2.TASK_STATUS_SUCCEEDED for t in tasks)

            deadline = started + VT_S / 2
            while not await all_done():
                assert time.monotonic() < deadline, "tasks not done well before the VT"
                await asyncio.sleep(0.2)
            took_s = time.monotonic() - started
            tasks = await _tasks(stub, ids)
            workers = {w.worker_id: w for w in
                       (await admin.ListWorkers(dtq_pb2.ListWorkersRequest())).workers}
        # the unread leases came back with no attempt spent, and nothing dead-lettered
        assert [t.attempt for t in tasks] == [1] * len(ids)
        assert all(t.status == dtq_pb2.TASK_STATUS_SUCCEEDED for t in tasks)
        released = _metric("dtq_leases_released_unread_total") - released_before
        assert 1 <= released <= WINDOW  # the frozen stream held at most its window
        assert took_s < VT_S / 2
        # connected (heartbeating) but not leasing
        assert workers["w-frozen"].alive and not workers["w-frozen"].leasing
        assert workers["w-healthy"].leasing
        # the stream reads again: it holds the tasks written to it, then ends UNAVAILABLE
        # (reason NOT_READING); a late Ack of a released lease is refused and changes nothing
        got: list[dtq_pb2.LeasedTask] = []
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            async for msg in it:
                got.append(msg.task)
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
        assert error_reason(ended.value) == "NOT_READING"
        assert 1 <= len(got) <= WINDOW
        with pytest.raises(grpc.aio.AioRpcError) as stale:
            await stub.Ack(dtq_pb2.AckRequest(items=[dtq_pb2.AckItem(
                lease_id=got[0].lease_id, result=b'"late"')]))
        assert error_reason(stale.value) == "STALE_LEASE"
        again = (await _tasks(stub, [got[0].task_id]))[0]
        assert again.status == dtq_pb2.TASK_STATUS_SUCCEEDED and again.attempt == 1
    finally:
        beats.cancel()
        await lease_channel.close()
        await beat_channel.close()
        await gw.stop()
