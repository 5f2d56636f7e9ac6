"""Shared fixtures: a private redis-server per test session, flushed per test."""

from __future__ import annotations

from typing import Iterator

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
