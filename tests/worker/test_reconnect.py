"""Dead connections and gateway outages: keepalive and a bounded reconnect, end to end.

Both tests run the reference worker against a real in-process gateway and Redis.
"""

from __future__ import annotations

import asyncio
import time

from prometheus_client import REGISTRY

from dtq_gateway.server import Gateway, grpc_options
from dtq_proto import dtq_pb2
from dtq_pyworker import AsyncClient, Worker, _channel
from tests.conftest import gateway_settings
from tests.support.redis_server import free_port, port_held
from tests.support.tcp_proxy import TcpProxy
from tests.worker.helpers import poll_until, running

#: A gateway down this long: the channel's own backoff (1 s × 1.6ⁿ, up to 120 s)
#: would have grown past the worker's cap by then.
OUTAGE_S = 10.0
#: The worker's reconnect cap in the outage test (s), and the slack on top of it
#: (+20 % jitter) for reconnecting, SessionInfo and dispatch.
CAP_S = 1.0
MARGIN_S = 1.0


def test_keepalive_defaults_are_applied():
    opts = dict(_channel.default_options())
    assert opts["grpc.keepalive_time_ms"] == _channel.KEEPALIVE_TIME_MS == 10_000
    assert opts["grpc.http2.ping_timeout_ms"] == _channel.KEEPALIVE_TIMEOUT_MS
    assert opts["grpc.keepalive_permit_without_calls"] == 1
    assert opts["grpc.http2.max_pings_without_data"] == 0
    assert opts["grpc.max_reconnect_backoff_ms"] == _channel.RECONNECT_MAX_S * 1000
    server = dict(grpc_options(gateway_settings("redis://127.0.0.1:1/0")))
    assert (server["grpc.keepalive_time_ms"], server["grpc.keepalive_timeout_ms"]) == (10000, 5000)
    # the gateway accepts the workers' pings: its floor is below their keepalive time
    assert server["grpc.http2.min_ping_interval_without_data_ms"] <= _channel.KEEPALIVE_TIME_MS
    assert server["grpc.keepalive_permit_without_calls"] == 1


def _sessions() -> float:
    return REGISTRY.get_sample_value("dtq_lease_sessions") or 0


async def test_worker_reconnects_after_its_connection_is_black_holed(redis_url, monkeypatch):
    # the same mechanism as the defaults, on a test time scale (ping every 0.5 s)
    monkeypatch.setattr(_channel, "KEEPALIVE_TIME_MS", 500)
    monkeypatch.setattr(_channel, "KEEPALIVE_TIMEOUT_MS", 1000)
    gw = Gateway(gateway_settings(redis_url, grpc_keepalive_time_ms=500,
                                  grpc_keepalive_timeout_ms=1000,
                                  grpc_min_ping_interval_ms=200), redis_url)
    await gw.start()
    proxy = await TcpProxy(gw.port).start()
    worker = Worker(["ka"], f"127.0.0.1:{proxy.port}", worker_id="w-ka", concurrency=1,
                    drain_grace_s=2)
    worker.register("t", lambda payload, ctx: "done")
    try:
        async with AsyncClient(f"127.0.0.1:{gw.port}") as client, running(worker):
            first = (await client.enqueue("ka", "t", {})).task_id
            assert (await client.wait(first, 10)).status == dtq_pb2.TASK_STATUS_SUCCEEDED
            assert proxy.accepted == 1 and _sessions() == 1
            cut_at = time.monotonic()
            proxy.blackhole()
            # keepalive finds the dead connection on both sides: the gateway ends the
            # black-holed Lease stream and the worker opens a new connection
            await poll_until(lambda: proxy.accepted >= 2, timeout_s=8)
            reconnect_s = time.monotonic() - cut_at
            await poll_until(lambda: worker.session is not None and _sessions() == 1, 8)
            second = (await client.enqueue("ka", "t", {})).task_id
            done = await client.wait(second, 10)
        assert done.status == dtq_pb2.TASK_STATUS_SUCCEEDED
        assert reconnect_s < 4.0  # keepalive time + timeout (1.5 s) + reconnect
    finally:
        await proxy.stop()
        await gw.stop()


async def test_worker_is_back_within_its_cap_after_a_gateway_outage(redis_url):
    port = free_port()
    settings = gateway_settings(redis_url, listen=f"127.0.0.1:{port}")
    gw = Gateway(settings, redis_url)
    await gw.start()
    worker = Worker(["out"], f"127.0.0.1:{port}", worker_id="w-out", concurrency=1,
                    drain_grace_s=2, reconnect_max_s=CAP_S)
    started = asyncio.Event()

    @worker.task("t")
    async def handler(payload, ctx):
        started.set()
        return "ok"

    async with running(worker):
        await poll_until(lambda: worker.session is not None and _sessions() == 1, 5)
        await gw.stop()
        with port_held(port):  # no other test's server takes the port meanwhile
            await asyncio.sleep(OUTAGE_S)  # the outage itself: the gateway is down this long
        gw = Gateway(settings, redis_url)
        await gw.start()
        back_at = time.monotonic()
        try:
            # a channel of its own: grpc shares one connection (and its backoff) between
            # channels with equal options in a process, and the test measures the worker's
            async with AsyncClient(f"127.0.0.1:{port}",
                                   channel_options=[("grpc.use_local_subchannel_pool", 1)]
                                   ) as client:
                res = await client.enqueue("out", "t", {})
                await asyncio.wait_for(started.wait(), 30)
                late_s = time.monotonic() - back_at
                # its Ack lands before the gateway stops, so the worker's exit does not
                # wait out the retries of a result it cannot deliver
                await client.wait(res.task_id, 10)
        finally:
            await gw.stop()
    assert late_s <= CAP_S * 1.2 + MARGIN_S, late_s


