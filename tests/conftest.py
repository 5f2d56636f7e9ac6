"""Shared fixtures: a private redis-server per test session, flushed per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.support.redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One private redis-server (never the shared one on 6379) for the session."""
    server = RedisServer(appendonly=False).start()
    yield server
    server.cleanup()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """URL of the session server, emptied before each test."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    yield redis_server.url


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own (AOF on), for tests that kill or restart it."""
    server = RedisServer(appendonly=True).start()
    yield server
    server.cleanup()


def gateway_settings(redis_url: str, **overrides):
    """Settings for an in-process test gateway (fast timings, no metrics port)."""
    from dtq_gateway.settings import load

    env = {"DTQ_REDIS_URL": redis_url, "DTQ_LISTEN": "127.0.0.1:0", "DTQ_METRICS_PORT": "0",
           "DTQ_VISIBILITY_TIMEOUT_S": "2", "DTQ_HEARTBEAT_INTERVAL_S": "0.5",
           "DTQ_SCHEDULER_INTERVAL_MS": "50", "DTQ_SHUTDOWN_GRACE_S": "1",
           "DTQ_LOG_FORMAT": "text"}
    env.update({f"DTQ_{k.upper()}": str(v) for k, v in overrides.items()})
    return load([], environ=env)


@pytest.fixture
async def gateway(redis_url):
    """An in-process gateway on 127.0.0.1:<free port>; yields it (``.port``)."""
    from dtq_gateway.server import Gateway

    gw = Gateway(gateway_settings(redis_url), redis_url)
    await gw.start()
    yield gw
    await gw.stop()


@pytest.fixture
async def channel(gateway):
    """A grpc.aio channel to the in-process gateway."""
    import grpc

    ch = grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}")
    yield ch
    await ch.close()


@pytest.fixture
def broker_stub(channel):
    """dtq.v1.Broker stub on the test channel."""
    from dtq_proto import dtq_pb2_grpc

    return dtq_pb2_grpc.BrokerStub(channel)
