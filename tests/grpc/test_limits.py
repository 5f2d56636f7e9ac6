"""Bounds on what one client can make a gateway hold, on real gateways: calls per
peer, bytes buffered for a Lease stream that does not read, log line size, and where
/metrics listens."""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.error
import urllib.request

import grpc
import pytest
from prometheus_client import REGISTRY

from dtq_gateway.logconf import TruncatingFilter
from dtq_gateway.server import Gateway
from dtq_gateway.store import keys
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.conftest import gateway_settings
from tests.support.leasing import error_reason
from tests.support.redis_server import free_port


def refusals(limit: str) -> float:
    return REGISTRY.get_sample_value("dtq_limit_refusals_total", {"limit": limit}) or 0


async def _gateway(redis_url, **overrides) -> Gateway:
    gw = Gateway(gateway_settings(redis_url, **overrides), redis_url)
    await gw.start()
    return gw


async def test_calls_per_peer_are_bounded(redis_url):
    gw = await _gateway(redis_url, max_streams_per_peer=3)
    before = refusals("max_streams_per_peer")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
            stub = dtq_pb2_grpc.BrokerStub(ch)
            calls = [stub.Lease(pb.LeaseRequest(worker_id=f"w{i}", queues=["q"],
                                                max_in_flight=1)) for i in range(3)]
            for call in calls:
                await call.read()
            extra = stub.Lease(pb.LeaseRequest(worker_id="w9", queues=["q"], max_in_flight=1))
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await extra.read()
            assert (exc.value.code(), error_reason(exc.value)) == (
                grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_CALLS")
            with pytest.raises(grpc.aio.AioRpcError):  # unary calls count as well
                await stub.GetTask(pb.GetTaskRequest(task_id="a" * 32))
            assert refusals("max_streams_per_peer") == before + 2
            calls[0].cancel()
            deadline = time.monotonic() + 5
            while sum(gw_open(gw).values()) > 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            again = stub.Lease(pb.LeaseRequest(worker_id="w0", queues=["q"], max_in_flight=1))
            assert (await again.read()).HasField("session")
            for call in (*calls, again):
                call.cancel()
    finally:
        await gw.stop()


def gw_open(gw: Gateway) -> dict[str, int]:
    from dtq_gateway.rpc.limits import PeerLimitInterceptor

    (limiter,) = [i for i in gw.interceptors if isinstance(i, PeerLimitInterceptor)]
    return limiter.open


async def test_a_lease_stream_that_never_reads_pins_a_bounded_number_of_bytes(redis_url):
    """400 leases of 256 KiB for a stream that reads nothing: the gateway buffers at most
    DTQ_LEASE_BUFFER_MAX_BYTES of payload for it (the rest is released at once, back to
    the queue), and every task is still there once the stream ends."""
    cap = 4 << 20
    gw = await _gateway(redis_url, lease_buffer_max_bytes=cap)
    before = refusals("lease_buffer_max_bytes")
    payload = b'"' + b"x" * (256 * 1024 - 2) + b'"'
    try:
        async with grpc.aio.insecure_channel(
                f"127.0.0.1:{gw.port}",
                options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
            stub = dtq_pb2_grpc.BrokerStub(ch)
            for _ in range(4):
                await stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[pb.EnqueueRequest(
                    queue="big", task_type="t", payload=payload) for _ in range(100)]))
            # concurrency 200: an unread window of 400 (protocol.md 3.3), so the byte
            # cap is what bounds this stream
            call = stub.Lease(pb.LeaseRequest(worker_id="slow", queues=["big"],
                                              max_in_flight=400, concurrency=200))
            await call.read()  # the session message; then nothing is ever read
            peak, deadline = 0, time.monotonic() + 15.0
            while time.monotonic() < deadline:
                peak = max(peak, gw.dispatcher.buffered_total)
                if refusals("lease_buffer_max_bytes") > before and peak:
                    break
                await asyncio.sleep(0.005)
            assert 0 < peak <= cap, peak
            assert refusals("lease_buffer_max_bytes") > before
            call.cancel()
        deadline = time.monotonic() + 10
        while gw.dispatcher.sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert gw.dispatcher.buffered_total == 0
        # nothing lost: every task is queued again (released) or still leased
        depth = sum([await gw.redis.xlen(keys.stream("big", b)) for b in range(10)])
        assert depth == 400
    finally:
        await gw.stop()


def test_log_lines_cut_client_strings():
    record = logging.LogRecord("dtq", logging.INFO, __file__, 1, "audit %s", ("x" * 10_000_000,),
                               None)
    record.detail = "é" * 5_000_000
    record.queues = ["q" * 64] * 100_000
    TruncatingFilter().filter(record)
    assert len(record.getMessage().encode()) < 4096
    assert len(record.detail.encode()) < 4096 and len(record.queues) < 4096


async def test_pause_reason_is_cut_in_the_log_line(channel, caplog):
    """The reason (10 MiB) is logged through the filter the gateway's handler carries."""
    from dtq_gateway import logconf

    handler = logging.Handler()
    lines: list[str] = []
    handler.emit = lambda r: lines.append(f"{r.getMessage()} {getattr(r, 'detail', '')}")
    handler.addFilter(TruncatingFilter())
    logging.getLogger().addHandler(handler)
    caplog.set_level(logging.INFO)
    try:
        admin = dtq_pb2_grpc.AdminStub(channel)
        await admin.PauseQueue(pb.PauseQueueRequest(queue="q", reason="r" * (10 << 20),
                                                   create=True))
    finally:
        logging.getLogger().removeHandler(handler)
    audit = [line for line in lines if line.startswith("audit pause_queue")]
    assert audit and all(len(line) < 8192 for line in lines)
    assert any(isinstance(f, TruncatingFilter) for f in _configured_filters(logconf))


def _configured_filters(logconf) -> list:
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    try:
        logconf.configure("INFO", "text")
        return list(root.handlers[0].filters)
    finally:
        root.handlers[:] = saved
        root.setLevel(level)


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return resp.status
    except (urllib.error.URLError, ConnectionError):
        return 0


async def test_metrics_bind_to_their_own_host(redis_url):
    port = free_port()
    gw = await _gateway(redis_url, metrics_port=port, metrics_host="127.0.0.2")
    try:
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, _get, f"http://127.0.0.2:{port}/metrics") == 200
        assert await loop.run_in_executor(None, _get, f"http://127.0.0.1:{port}/metrics") == 0
    finally:
        await gw.stop()


async def test_new_queue_names_beyond_the_cap_are_refused(redis_url):
    gw = await _gateway(redis_url, max_queues=3)
    before = refusals("max_queues")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
            stub = dtq_pb2_grpc.BrokerStub(ch)

            def enq(q: str) -> pb.EnqueueRequest:
                return pb.EnqueueRequest(queue=q, task_type="t", payload=b"{}")

            for q in ("q1", "q2", "q3", "q1"):
                assert (await stub.Enqueue(enq(q))).task_id
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await stub.Enqueue(enq("q4"))
            assert (exc.value.code(), error_reason(exc.value)) == (
                grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_QUEUES")
            batch = await stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[enq("q2"),
                                                                          enq("q5")]))
            assert batch.results[0].task_id
            assert batch.results[1].error.reason == "TOO_MANY_QUEUES"
            lease = stub.Lease(pb.LeaseRequest(worker_id="w", queues=["q1", "q6"],
                                               max_in_flight=1))
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await lease.read()
            assert (exc.value.code(), error_reason(exc.value)) == (
                grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_QUEUES")
        assert refusals("max_queues") == before + 3
        assert await gw.redis.zcard("dtq:queues") == 3
        assert not await gw.redis.exists(*[keys.stream(q, 5) for q in ("q4", "q5", "q6")])
    finally:
        await gw.stop()


async def test_idle_queues_are_deleted_and_come_back_on_use(redis_url):
    """A drained queue nothing writes to is deleted (streams and registry entry) once no
    live worker leases from it; a paused one is kept, and so is an empty queue a worker
    waits on though it never wrote or read it; a deleted name works again at once."""
    from dtq_gateway.store import keys
    from tests.support.leasing import LeaseStream, poll

    gw = await _gateway(redis_url, queue_idle_delete_s=0.5)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
            stub = dtq_pb2_grpc.BrokerStub(ch)
            admin = dtq_pb2_grpc.AdminStub(ch)
            for q in ("gone", "paused"):
                await stub.Enqueue(pb.EnqueueRequest(queue=q, task_type="t", payload=b"{}"))
            listener = await LeaseStream(stub, "w1", ["gone", "paused"]).open()
            done = await listener.take(2)
            await stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=t.lease_id)
                                                for t in done]))
            await admin.PauseQueue(pb.PauseQueueRequest(queue="paused"))
            waiting = await LeaseStream(stub, "w2", ["empty"]).open()  # never written

            async def registry() -> set[str]:
                return {m.decode() for m in await gw.redis.zrange(keys.QUEUES, 0, -1)}

            # once "gone" is drained and out of the busy set (after the new leader's
            # reclaim hold), sweeps pass over it while w1 and w2 listen: all stay
            sweep = gw.scheduler.queue_sweep
            await poll(lambda: gw.redis.sismember(keys.BUSY_QUEUES, "gone"),
                       lambda busy: not busy, timeout_s=15)
            batches = sweep.batches
            await poll(lambda: asyncio.sleep(0, sweep.batches),
                       lambda n: n >= batches + 6, timeout_s=15)  # 3 passes of 3 names
            assert await registry() == {"gone", "paused", "empty"}
            assert sweep.deleted == 0
            listener.close()  # its session ends: its record says "stopped"
            await poll(registry, lambda r: r == {"paused", "empty"}, timeout_s=15)
            assert not await gw.redis.exists(*keys.queue_streams_desc("gone"))
            assert await gw.redis.exists(keys.stream("paused", 5))
            waiting.close()
            await poll(registry, lambda r: r == {"paused"}, timeout_s=15)
            again = await stub.Enqueue(pb.EnqueueRequest(queue="gone", task_type="t",
                                                         payload=b"{}"))
            back = await LeaseStream(stub, "w3", ["gone"]).open()
            assert (await back.next(10)).task_id == again.task_id
            assert "gone" in await registry()
            back.close()
    finally:
        await gw.stop()


async def test_a_deleted_queue_loses_its_metric_series(redis_url):
    """The idle-queue sweep deletes a drained queue: every series labelled with it
    leaves /metrics (queue churn cannot grow it without bound); a live queue's stay."""
    from prometheus_client import generate_latest

    from tests.support.leasing import LeaseStream, poll

    gw = await _gateway(redis_url, queue_idle_delete_s=0.5)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
            stub = dtq_pb2_grpc.BrokerStub(ch)
            for q in ("series-gone", "series-live"):
                await stub.Enqueue(pb.EnqueueRequest(queue=q, task_type="t", payload=b"{}"))
            lease = await LeaseStream(stub, "w1", ["series-gone"]).open()
            task = await lease.next()
            await stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=task.lease_id)]))
            lease.close()

            async def series(queue: str) -> list[str]:
                text = generate_latest(REGISTRY).decode()
                return [line for line in text.splitlines() if f'queue="{queue}"' in line]

            assert 'dtq_tasks_succeeded_total{queue="series-gone"} 1.0' in await series(
                "series-gone")
            await poll(lambda: series("series-gone"), lambda lines: not lines, timeout_s=15)
            assert await gw.redis.zscore(keys.QUEUES, "series-gone") is None  # deleted
            assert 'dtq_tasks_enqueued_total{queue="series-live"} 1.0' in await series(
                "series-live")
            assert await gw.redis.zscore(keys.QUEUES, "series-live") is not None
    finally:
        await gw.stop()


async def _flood(port: int, connections: int, calls: int) -> tuple[dict[str, int], int]:
    """Start ``calls`` Enqueue calls at once into queue ``flood`` over ``connections``
    separate connections; return ({status code name: count}, tasks enqueued)."""
    opts = [("grpc.use_local_subchannel_pool", 1)]  # one connection per channel
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=opts)
                for _ in range(connections)]
    try:
        for ch in channels:
            await asyncio.wait_for(ch.channel_ready(), 10)
        stubs = [dtq_pb2_grpc.BrokerStub(ch) for ch in channels]

        async def one(i: int) -> str:
            try:
                await stubs[i % connections].Enqueue(
                    pb.EnqueueRequest(queue="flood", task_type="t", payload=b"{}"), timeout=60)
            except grpc.aio.AioRpcError as exc:
                return exc.code().name
            return "OK"

        codes: dict[str, int] = {}
        for code in await asyncio.gather(*(one(i) for i in range(calls))):
            codes[code] = codes.get(code, 0) + 1
        admin = dtq_pb2_grpc.AdminStub(channels[0])
        depth = (await admin.GetQueueStats(pb.GetQueueStatsRequest(queue="flood"))).depth
        return codes, depth
    finally:
        for ch in channels:
            await ch.close()


async def test_calls_beyond_the_stream_limit_wait_in_the_client(redis_url):
    # grpc's default overload protection counted finished calls until Python released
    # them and answered RST_STREAM REFUSED_STREAM (UNAVAILABLE) within the limit
    gw = await _gateway(redis_url, grpc_max_concurrent_streams=10)
    try:
        assert await _flood(gw.port, connections=1, calls=300) == ({"OK": 300}, 300)
    finally:
        await gw.stop()


async def test_a_burst_within_the_pending_limit_is_not_cancelled(redis_url):
    # grpc's default pending-call limit (1000, random rejection up to 3000) cancelled
    # calls of such a burst over two connections
    gw = await _gateway(redis_url)
    try:
        assert await _flood(gw.port, connections=2, calls=1600) == ({"OK": 1600}, 1600)
    finally:
        await gw.stop()


async def test_calls_beyond_the_pending_limit_are_cancelled_before_any_handler(redis_url):
    gw = await _gateway(redis_url, grpc_max_pending_calls=20)
    try:
        codes, depth = await _flood(gw.port, connections=4, calls=800)
    finally:
        await gw.stop()
    assert set(codes) == {"OK", "CANCELLED"}
    assert depth == codes["OK"]  # a cancelled call enqueued nothing
