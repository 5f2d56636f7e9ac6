"""The metrics refresh exports Redis's memory, CPU and reachability (dtq_redis_*),
read from a real redis-server, and drops dtq_redis_up to 0 when Redis is unreachable."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from dtq_gateway.duties.queue_gauges import QueueGaugeCollector
from tests.support.redis_server import free_port


def sample(name: str) -> float | None:
    return REGISTRY.get_sample_value(name)


async def test_memory_cpu_and_up_come_from_redis(redis_url) -> None:
    r = aioredis.from_url(redis_url)
    try:
        await r.config_set("maxmemory", 512 << 20)
        await QueueGaugeCollector(r, heartbeat_interval_ms=10_000).tick()
        info = await r.info("memory")
    finally:
        await r.config_set("maxmemory", 0)
        await r.aclose()
    assert sample("dtq_redis_up") == 1
    assert sample("dtq_redis_maxmemory_bytes") == 512 << 20
    used = sample("dtq_redis_used_memory_bytes")
    assert 0 < used and abs(used - info["used_memory"]) < 1 << 20
    assert sample("dtq_redis_cpu_seconds") > 0


async def test_unreachable_redis_sets_up_to_zero(redis_url) -> None:
    r = aioredis.from_url(redis_url)
    try:
        await QueueGaugeCollector(r, heartbeat_interval_ms=10_000).tick()
    finally:
        await r.aclose()
    assert sample("dtq_redis_up") == 1
    dead = aioredis.from_url(f"redis://127.0.0.1:{free_port()}", socket_connect_timeout=1)
    try:
        with pytest.raises(Exception):  # noqa: B017 - the outage error redis-py raises
            await QueueGaugeCollector(dead, heartbeat_interval_ms=10_000).tick()
    finally:
        await dead.aclose()
    assert sample("dtq_redis_up") == 0
