"""The rate-limit and schedule scripts against a private Redis, table-driven.

rate_limit_set.lua / rate_take.lua (token buckets in the queue's hash) and
schedule_advance.lua (compare-and-set progress of a schedule). The queue-wide cap
inside lease_take.lua is tested in test_lease_take.py.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from dtq_gateway.store import keys
from dtq_gateway.store.ratelimits import RATE_LIMIT_SET, RATE_TAKE
from dtq_gateway.store.schedules import ADVANCE
from tests.redis.sched_support import r

__all__ = ["r"]
KEY = keys.rate_limit("q")


async def set_cfg(r: Redis, scope: str, cfg: str) -> list:
    out, gone = await RATE_LIMIT_SET(r, [KEY], RATE_LIMIT_SET.argv(scope, cfg, "q", "tester"))
    return [out.decode(), int(gone)]


async def take(r: Redis, *pairs: object) -> list[list[int]]:
    return [[int(g), int(w)] for g, w in await RATE_TAKE(r, [KEY], RATE_TAKE.argv(*pairs))]


async def test_set_change_delete_outcomes(r: Redis) -> None:
    assert await set_cfg(r, "*", "5 1000 5") == ["created", 0]
    assert await set_cfg(r, "*", "10 1000 3") == ["changed", 0]
    assert await set_cfg(r, "email", "1 1000 1") == ["created", 0]
    assert await r.hget(KEY, "types") == b"1"
    assert float(await r.hget(KEY, "tok|*")) == 3.0  # capped at the new burst
    assert await set_cfg(r, "email", "") == ["deleted", 0]
    assert not await r.hexists(KEY, "types")
    assert await set_cfg(r, "email", "") == ["missing", 0]
    assert await set_cfg(r, "*", "") == ["deleted", 1]
    assert not await r.exists(KEY)


async def test_take_grants_whole_tokens_and_says_how_long_to_wait(r: Redis) -> None:
    await set_cfg(r, "*", "2 1000 2")  # one token per 500 ms
    assert await take(r, "*", 3) == [[2, 500]]  # a full bucket of 2, then empty
    granted, wait_ms = (await take(r, "*", 1))[0]
    assert granted == 0 and 1 <= wait_ms <= 500


async def test_no_limit_grants_everything_and_refunds_are_capped(r: Redis) -> None:
    assert await take(r, "other", 7) == [[7, 0]]
    await set_cfg(r, "*", "1 60000 2")
    assert (await take(r, "*", 2))[0][0] == 2
    assert await take(r, "*", -5) == [[0, 0]]
    assert float(await r.hget(KEY, "tok|*")) == pytest.approx(2.0, abs=0.01)


@pytest.mark.parametrize("state, expected", [
    ({}, "gone"),
    ({"gen": "other", "done_ms": 0}, "stale"),
    ({"gen": "g1", "done_ms": 0, "paused": "1"}, "paused"),
    ({"gen": "g1", "done_ms": 0, "paused": "0", "last_fire_ms": 0}, "ok"),
])
async def test_schedule_advance_outcomes(r: Redis, state: dict, expected: str) -> None:
    key = keys.periodic_schedule("s")
    if state:
        await r.hset(key, mapping=state)
    assert (await ADVANCE(r, [key], ADVANCE.argv("g1", 2000, 2000, "t1", 3000))).decode() \
        == expected
    if expected == "ok":
        assert await r.hmget(key, "done_ms", "last_fire_ms", "last_task_id", "fires_total",
                             "next_fire_ms") == [b"2000", b"2000", b"t1", b"1", b"3000"]
        # never backwards: an older fire (a slow second leader) changes no progress
        await ADVANCE(r, [key], ADVANCE.argv("g1", 1000, 1000, "t0", 3000))
        assert await r.hmget(key, "done_ms", "last_task_id", "fires_total") == \
            [b"2000", b"t1", b"1"]
    elif not state:
        assert not await r.exists(key)
