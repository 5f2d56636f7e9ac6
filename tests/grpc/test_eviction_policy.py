"""A Redis that may evict keys: refused at startup, at run time, or only warned about."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from dtq_gateway.server import Gateway
from dtq_gateway.store.redis_policy import EvictionPolicyError
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.conftest import gateway_settings
from tests.support.leasing import error_reason, poll
from tests.support.redis_server import RedisServer, free_port

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _gauge() -> float | None:
    return REGISTRY.get_sample_value("dtq_redis_eviction_safe")


def _set_policy(url: str, policy: str) -> None:
    with redis.Redis.from_url(url) as client:
        client.config_set("maxmemory-policy", policy)


async def test_evicting_redis_is_refused_at_startup(own_redis):
    _set_policy(own_redis.url, "volatile-lru")
    gw = Gateway(gateway_settings(own_redis.url), own_redis.url)
    with pytest.raises(EvictionPolicyError, match="volatile-lru.*noeviction"):
        await gw.start()
    assert _gauge() == 0


def test_evicting_redis_at_startup_gives_one_error_line_and_exit_1(own_redis):
    """operations.md, Redis settings: the gateway does not start, one ERROR line says
    which policy and how to fix it, exit status 1."""
    _set_policy(own_redis.url, "allkeys-lru")
    env = dict(os.environ, DTQ_REDIS_URL=own_redis.url, DTQ_LISTEN=f"127.0.0.1:{free_port()}",
               DTQ_METRICS_PORT="0", DTQ_LOG_FORMAT="json")
    proc = subprocess.run([sys.executable, "-m", "dtq_gateway"], env=env, check=False,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=60)
    assert proc.returncode == 1, proc.stderr
    records = [json.loads(line) for line in proc.stderr.splitlines()]
    errors = [r["message"] for r in records if r["level"] in ("ERROR", "CRITICAL")]
    assert len(errors) == 1, errors
    assert "allkeys-lru" in errors[0] and "CONFIG SET maxmemory-policy noeviction" in errors[0]
    assert "DTQ_REQUIRE_NOEVICTION=false" in errors[0]


async def test_policy_is_read_from_info_when_config_is_disabled():
    server = RedisServer(appendonly=False, extra_args=(
        "--rename-command", "CONFIG", "", "--maxmemory-policy", "allkeys-lru")).start()
    try:
        gw = Gateway(gateway_settings(server.url), server.url)
        with pytest.raises(EvictionPolicyError, match="allkeys-lru"):
            await gw.start()
    finally:
        server.cleanup()


async def test_warn_only_serves_and_logs_once(own_redis, caplog):
    _set_policy(own_redis.url, "allkeys-lfu")
    gw = Gateway(gateway_settings(own_redis.url, require_noeviction="false",
                                  eviction_check_interval_s=0.05), own_redis.url)
    caplog.set_level(logging.WARNING, logger="dtq_gateway.store.redis_policy")
    await gw.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
            health = health_pb2_grpc.HealthStub(ch)
            assert (await health.Check(health_pb2.HealthCheckRequest())).status == SERVING
            await dtq_pb2_grpc.BrokerStub(ch).Enqueue(pb.EnqueueRequest(queue="q", task_type="t"))
            for _ in range(3):
                await gw.probe.check_once()  # several reads of the same policy
        assert _gauge() == 0
        warned = [r for r in caplog.records if "allkeys-lfu" in r.getMessage()]
        assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    finally:
        await gw.stop()


async def test_policy_changed_at_run_time_stops_serving_until_fixed(own_redis, caplog):
    gw = Gateway(gateway_settings(own_redis.url, eviction_check_interval_s=0.05),
                 own_redis.url)
    await gw.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
            health = health_pb2_grpc.HealthStub(ch)
            broker = dtq_pb2_grpc.BrokerStub(ch)

            async def status():
                return (await health.Check(health_pb2.HealthCheckRequest())).status

            assert await status() == SERVING and _gauge() == 1
            _set_policy(own_redis.url, "volatile-lru")
            await poll(status, lambda s: s == NOT_SERVING)
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await broker.Enqueue(pb.EnqueueRequest(queue="q", task_type="t"))
            assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert error_reason(exc.value) == "REDIS_EVICTION_POLICY"
            assert any(r.levelno == logging.ERROR and "volatile-lru" in r.getMessage()
                       for r in caplog.records)
            _set_policy(own_redis.url, "noeviction")
            await poll(status, lambda s: s == SERVING)
            await broker.Enqueue(pb.EnqueueRequest(queue="q", task_type="t"))
            assert _gauge() == 1
    finally:
        await gw.stop()


def test_embedded_redis_runs_with_noeviction(tmp_path):
    from dtq_gateway.store.embedded import EmbeddedRedis

    embedded = EmbeddedRedis(str(tmp_path / "redis"))
    embedded.start()
    try:
        with redis.Redis.from_url(embedded.url) as client:
            assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
    finally:
        embedded.stop()


def test_one_embedded_redis_per_directory(tmp_path):
    """A second gateway on the same embedded directory is refused, naming the holder,
    instead of starting a second redis-server on the same AOF; the directory is free
    again once the first one stopped."""
    from dtq_gateway.store.embedded import EmbeddedRedis, EmbeddedRedisError

    first = EmbeddedRedis(str(tmp_path / "redis"))
    first.start()
    try:
        second = EmbeddedRedis(str(tmp_path / "redis"))
        with pytest.raises(EmbeddedRedisError, match="in use by another gateway"):
            second.start()
        assert second.proc is None
        with redis.Redis.from_url(first.url) as client:
            assert client.ping()
    finally:
        first.stop()
    again = EmbeddedRedis(str(tmp_path / "redis"))
    again.start()
    again.stop()


def test_the_embedded_redis_ends_with_its_gateway(tmp_path):
    """The gateway SIGKILLed (no chance to stop anything): its embedded redis-server
    gets the parent-death signal and exits too, instead of holding the AOF."""
    from tests.system.chaos_support import wait_until

    code = ("import sys, time\n"
            "from dtq_gateway.store.embedded import EmbeddedRedis\n"
            "r = EmbeddedRedis(sys.argv[1])\n"
            "r.start()\n"
            "print(r.proc.pid, flush=True)\n"
            "time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "redis")],
                              stdout=subprocess.PIPE, text=True)
    try:
        server = int(parent.stdout.readline())
    finally:
        parent.kill()
        parent.wait(timeout=30)

    def gone() -> bool:  # exited (a zombie where nothing reaps orphans) or reaped
        try:
            with open(f"/proc/{server}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except FileNotFoundError:
            return True
    wait_until(gone, 20, "redis-server to end with its gateway")
