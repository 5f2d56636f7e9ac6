"""Fixtures of the Redis-level tests."""

from __future__ import annotations

import pytest

from tests.redis.dispatch_support import ReadAheadEnv


@pytest.fixture
async def dispatch_env(redis_url):
    """A ReadAheadEnv with the groups of queue ``q`` created."""
    e = ReadAheadEnv(redis_url)
    await e.groups.ensure(e.redis, ["q"])
    yield e
    await e.redis.aclose()
