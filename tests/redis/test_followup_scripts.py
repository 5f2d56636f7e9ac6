"""chain_continued.lua and group_member.lua against a real Redis."""

from __future__ import annotations

import json

import redis.asyncio as aioredis

from dtq_gateway.store import keys
from dtq_gateway.store.followups import CHAIN_CONTINUED
from dtq_gateway.store.scripts import Script
from dtq_gateway.store.task_groups import GROUP_MEMBER

GID = "a" * 32


async def test_group_member_counts_each_member_once(redis_url):
    r = aioredis.Redis.from_url(redis_url)
    key = keys.group("cb", GID)
    outcome = json.dumps({"status": "succeeded"})
    assert await GROUP_MEMBER(r, [key], Script.argv("t1", outcome)) == [-1, 0]
    assert not await r.exists(key)  # a vanished group is not recreated
    await r.hset(key, mapping={"total": 2, "done": 0})
    assert await GROUP_MEMBER(r, [key], Script.argv("t1", outcome)) == [1, 2]
    assert await GROUP_MEMBER(r, [key], Script.argv("t1", "{}")) == [1, 2]  # repeat
    assert await GROUP_MEMBER(r, [key], Script.argv("t2", outcome)) == [2, 2]
    assert json.loads(await r.hget(key, "m:t1")) == {"status": "succeeded"}
    await r.aclose()


async def test_chain_continued_never_recreates_an_expired_record(redis_url):
    r = aioredis.Redis.from_url(redis_url)
    task, pending = keys.task("b" * 32), keys.chain_pending("q")
    await r.zadd(pending, {"b" * 32: 1})
    assert await CHAIN_CONTINUED(r, [task, pending], Script.argv("b" * 32, "c" * 32, "")) == 0
    assert not await r.exists(task) and not await r.exists(pending)
    await r.hset(task, "status", "succeeded")
    await r.expire(task, 100)
    await r.zadd(pending, {"b" * 32: 1})
    assert await CHAIN_CONTINUED(r, [task, pending], Script.argv("b" * 32, "c" * 32, "")) == 1
    assert await r.hget(task, "next_task_id") == b"c" * 32
    assert 0 < await r.ttl(task) <= 100 and await r.zcard(pending) == 0
    await r.aclose()
