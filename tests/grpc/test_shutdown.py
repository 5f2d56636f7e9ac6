"""Graceful gateway shutdown: Lease streams end UNAVAILABLE, unary calls finish, quick exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import grpc
import pytest

from dtq_gateway.server import Gateway
from dtq_proto import dtq_pb2_grpc
from tests.conftest import gateway_settings
from tests.support.leasing import LeaseStream
from tests.support.redis_server import free_port


async def test_stop_ends_lease_streams_with_unavailable(redis_url):
    gw = Gateway(gateway_settings(redis_url), redis_url)
    await gw.start()
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}")
    broker = dtq_pb2_grpc.BrokerStub(ch)
    lease = await LeaseStream(broker, "w1", ["q"]).open()
    started = time.monotonic()
    await gw.stop()
    assert time.monotonic() - started < gw.settings.shutdown_grace_s + 1
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await lease.next(timeout_s=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    await ch.close()


def test_sigterm_exits_zero_within_grace(redis_url):
    port = free_port()
    env = dict(os.environ, DTQ_REDIS_URL=redis_url, DTQ_LISTEN=f"127.0.0.1:{port}",
               DTQ_METRICS_PORT="0", DTQ_SHUTDOWN_GRACE_S="2")
    proc = subprocess.Popen([sys.executable, "-m", "dtq_gateway"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            grpc.channel_ready_future(ch).result(timeout=15)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - started < 2 + 1
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_a_taken_port_is_refused_not_shared(redis_url):
    port = free_port()
    env = dict(os.environ, DTQ_REDIS_URL=redis_url, DTQ_LISTEN=f"127.0.0.1:{port}",
               DTQ_METRICS_PORT="0")
    first = subprocess.Popen([sys.executable, "-m", "dtq_gateway"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            grpc.channel_ready_future(ch).result(timeout=15)
        second = subprocess.run([sys.executable, "-m", "dtq_gateway"], env=env, check=False,
                                capture_output=True, text=True, timeout=30)
        assert second.returncode == 1
        assert "gateway failed" in second.stderr
    finally:
        first.terminate()
        first.wait(timeout=10)
