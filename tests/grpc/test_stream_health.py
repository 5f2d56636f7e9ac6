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
    ended_before = _metric("dtq_lease_streams_not_reading_total")
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
        assert _metric("dtq_lease_streams_not_reading_total") - ended_before == 1
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


async def test_b_a_slow_reader_with_a_large_max_in_flight_reads_few_stale_leases(redis_url):
    hb_s, vt_s, read_every_s = 2.0, 8.0, 1.0
    gw = Gateway(gateway_settings(redis_url, heartbeat_interval_s=hb_s,
                                  visibility_timeout_s=vt_s), redis_url)
    await gw.start()
    target = f"127.0.0.1:{gw.port}"
    lease_channel = grpc.aio.insecure_channel(target)
    channel = grpc.aio.insecure_channel(target)
    stub = dtq_pb2_grpc.BrokerStub(channel)
    beats = asyncio.create_task(_heartbeats(stub, "w-slow", set(), hb_s))
    worker = Worker(["slow"], target, worker_id="w-fast", concurrency=2, drain_grace_s=2)

    @worker.task("t")
    async def handler(payload, ctx):
        await asyncio.sleep(0.05)
        return "done"

    stale = 0
    read = 0

    async def read_slowly(it) -> None:
        """One message per second, acked at once (a stale one is refused)."""
        nonlocal stale, read
        while True:
            await asyncio.sleep(read_every_s)
            msg = await it.__anext__()
            read += 1
            try:
                await stub.Ack(dtq_pb2.AckRequest(items=[dtq_pb2.AckItem(
                    lease_id=msg.task.lease_id, result=b'"slow"')]))
            except grpc.aio.AioRpcError as exc:
                assert error_reason(exc) == "STALE_LEASE"
                stale += 1

    reader = None
    try:
        call = dtq_pb2_grpc.BrokerStub(lease_channel).Lease(dtq_pb2.LeaseRequest(
            worker_id="w-slow", queues=["slow"], max_in_flight=100, concurrency=1,
            hostname="slow"))
        it = call.__aiter__()
        await asyncio.wait_for(it.__anext__(), 10)
        async with running(worker):
            await poll_until(lambda: len(gw.dispatcher.sessions) == 2, 10)
            ids = await _enqueue(stub, "slow", 150, max_attempts=3)
            reader = asyncio.create_task(read_slowly(it))
            deadline = time.monotonic() + 4 * vt_s
            tasks = await _tasks(stub, ids)
            while time.monotonic() < deadline and not all(
                    t.status == dtq_pb2.TASK_STATUS_SUCCEEDED for t in tasks):
                await asyncio.sleep(0.5)
                tasks = await _tasks(stub, ids)
        second = sum(1 for t in tasks if t.attempt > 1)
        # today's gateway fills the stream's transport window with up to max_in_flight
        # leases: those it cannot read within the visibility timeout expire (a second
        # attempt each), and it then reads them stale
        assert read >= 1
        assert stale <= 1, f"{stale} of {read} reads were stale"
        assert second <= 2, f"{second} tasks needed a second attempt"
        assert all(t.status == dtq_pb2.TASK_STATUS_SUCCEEDED for t in tasks)
    finally:
        beats.cancel()
        if reader is not None:
            reader.cancel()
        call.cancel()
        await lease_channel.close()
        await channel.close()
        await gw.stop()


async def test_receipts_through_another_replica_keep_a_reading_stream(redis_url):
    """A worker whose stream is on one replica and whose heartbeats reach another is
    reading: its leases are confirmed through Redis, nothing is released."""
    settings = {"heartbeat_interval_s": 0.5, "visibility_timeout_s": VT_S}
    gw_a = Gateway(gateway_settings(redis_url, **settings), redis_url)
    gw_b = Gateway(gateway_settings(redis_url, **settings), redis_url)
    await gw_a.start()
    await gw_b.start()
    chan_a = grpc.aio.insecure_channel(f"127.0.0.1:{gw_a.port}")
    chan_b = grpc.aio.insecure_channel(f"127.0.0.1:{gw_b.port}")
    stub_b = dtq_pb2_grpc.BrokerStub(chan_b)
    held: set[str] = set()
    beats = asyncio.create_task(_heartbeats(stub_b, "w-split", held, 0.5))
    released_before = _metric("dtq_leases_released_unread_total")
    try:
        call = dtq_pb2_grpc.BrokerStub(chan_a).Lease(dtq_pb2.LeaseRequest(
            worker_id="w-split", queues=["split"], max_in_flight=4, concurrency=1,
            hostname="split"))
        it = call.__aiter__()
        await asyncio.wait_for(it.__anext__(), 10)
        await _enqueue(stub_b, "split", 4, max_attempts=1)
        got = []
        for _ in range(4):
            got.append((await asyncio.wait_for(it.__anext__(), 10)).task)
            held.add(got[-1].lease_id)
        # several stall thresholds (2 heartbeat intervals) pass with the leases held
        await asyncio.sleep(4.0)  # 4 x the stall threshold (2 heartbeat intervals)
        assert len(gw_a.dispatcher.sessions) == 1
        assert _metric("dtq_leases_released_unread_total") == released_before
        reply = await stub_b.Ack(dtq_pb2.AckRequest(items=[
            dtq_pb2.AckItem(lease_id=t.lease_id, result=b'"ok"') for t in got]))
        assert [r.HasField("error") for r in reply.results] == [False] * 4
    finally:
        beats.cancel()
        call.cancel()
        await chan_a.close()
        await chan_b.close()
        await gw_a.stop()
        await gw_b.stop()
