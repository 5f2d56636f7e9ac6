"""Many idle queues cost the leader's duties nothing: only busy queues are reaped.

The leftovers of drained queues (ten empty band streams with their group, and the
registry entry) are written directly with a pipeline, the way a gateway leaves them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from dtq_gateway.duties.leader import LeaderLock
from dtq_gateway.duties.reaper import Reaper
from dtq_gateway.duties.scheduler import Scheduler
from dtq_gateway.settings import Settings
from dtq_gateway.store import groups, keys
from tests.redis.sched_support import r, redis_ms, seed_lease, seed_task, task_fields, wait_until
from tests.support.drained_queues import leftovers

__all__ = ["r"]

IDLE_QUEUES = 2000
VT_S = 1.0


async def command_calls(r: Redis) -> dict[str, int]:
    """calls per command since the last CONFIG RESETSTAT (commands run by scripts too)."""
    stats = await r.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


@pytest.fixture
async def leader(r: Redis, redis_url: str) -> AsyncIterator[Scheduler]:
    """The scheduler duties of one replica, leading, with a VT_S visibility timeout."""
    # the registry counts as built (as leftovers() says too): otherwise the new leader's
    # one-time backfill SCAN may land in a test's measuring window
    await r.set(keys.QUEUES_BACKFILLED, "1")
    client = Redis.from_url(redis_url)
    s = Scheduler(client, Settings(gateway_id="gw", visibility_timeout_s=VT_S,
                                   heartbeat_interval_s=0.5, scheduler_interval_ms=50,
                                   queue_idle_delete_s=0))  # the sweep has its own tests
    task = asyncio.create_task(s.run())
    await wait_until(lambda: s.is_leader)
    yield s
    await s.stop()
    await asyncio.wait_for(task, 5)
    await client.aclose()


async def test_lost_lease_among_idle_queues_comes_back_within_vt_plus_2s(
        r: Redis, redis_url: str) -> None:
    await leftovers(r, IDLE_QUEUES)
    tid = await seed_task(r, queue="live", max_attempts=3)
    await r.config_resetstat()
    client = Redis.from_url(redis_url)
    s = Scheduler(client, Settings(gateway_id="gw", visibility_timeout_s=VT_S,
                                   heartbeat_interval_s=0.5, scheduler_interval_ms=50,
                                   queue_idle_delete_s=0))  # the sweep has its own tests
    run = asyncio.create_task(s.run())
    try:
        await wait_until(lambda: s.is_leader)
        await seed_lease(r, tid, "w-silent")  # the lease's idle clock starts
        leased_at = time.monotonic()

        async def retried() -> bool:
            return (await task_fields(r, tid))["attempt"] == "2"

        await wait_until(retried, timeout_s=VT_S + 3)
        took_s = time.monotonic() - leased_at
        calls = await command_calls(r)
    finally:
        await s.stop()
        await asyncio.wait_for(run, 5)
        await client.aclose()
    assert took_s < VT_S + 2.0, took_s  # loose: a loaded machine adds its own delays
    assert (await task_fields(r, tid))["status"] == "queued"
    # the reaper looked at the one busy queue, never at the 20,000 idle streams
    assert calls.get("xautoclaim", 0) < 100, calls
    assert calls.get("xlen", 0) < 10 * 100, calls
    assert "scan" not in calls and "xinfo|groups" not in calls, calls
    assert s.reaper.queue_calls < 100


async def test_idle_leader_load_does_not_grow_with_idle_queues(r: Redis,
                                                               leader: Scheduler) -> None:
    await leftovers(r, IDLE_QUEUES)
    before = int((await r.info("stats"))["total_commands_processed"])
    started = time.monotonic()
    await asyncio.sleep(1.0)  # a measuring window, not synchronisation
    after = int((await r.info("stats"))["total_commands_processed"])
    per_s = (after - before - 2) / (time.monotonic() - started)
    # mover (TIME + ZRANGEBYSCORE every 50 ms), reaper (SSCAN every 250 ms), lock
    # refresh and worker sweep: about 50/s here, whatever the number of queues
    assert per_s < 100, per_s


async def test_busy_set_shrinks_when_a_queue_drains(r: Redis, leader: Scheduler) -> None:
    await leftovers(r, 50)
    tid = await seed_task(r, queue="live", max_attempts=3)
    stream, entry_id = await seed_lease(r, tid, "w1")
    assert await r.smembers(keys.BUSY_QUEUES) == {b"live"}
    await r.xack(stream, keys.GROUP, entry_id)  # what ack.lua does at the end of a lease
    await r.xdel(stream, entry_id)

    async def drained() -> bool:
        return not await r.exists(keys.BUSY_QUEUES)

    await wait_until(drained, timeout_s=VT_S + 2)


async def test_task_moved_into_a_drained_queue_is_watched_by_the_reaper(
        r: Redis, leader: Scheduler) -> None:
    names = await leftovers(r, 100)
    drained = names[42]
    tid = await seed_task(r, queue=drained, priority=3, max_attempts=2)
    await r.zadd(keys.schedule(drained), {tid: await redis_ms(r) - 1})
    await r.set(keys.busy_marker(drained), "1")  # what enqueue.lua and the gateway do
    await r.sadd(keys.BUSY_QUEUES, drained)

    async def moved() -> bool:
        return (await task_fields(r, tid))["status"] == "queued"

    await wait_until(moved)
    assert await r.smembers(keys.BUSY_QUEUES) == {drained.encode()}
    stream = keys.stream(drained, 3)
    got = await r.xreadgroup(keys.GROUP, "w-silent", {stream: ">"}, count=1)  # leased...
    assert got and got[0][1][0][1][b"task_id"] == tid.encode()
    await r.hset(keys.task(tid), mapping={"status": "active", "worker_id": "w-silent"})

    async def retried() -> bool:  # ...and never heard of again
        return (await task_fields(r, tid))["attempt"] == "2"

    await wait_until(retried, timeout_s=VT_S + 3)
    entries = await r.xrange(stream)
    assert [(e[1][b"task_id"], e[1][b"attempt"]) for e in entries] == [(tid.encode(), b"2")]


async def test_backfill_builds_registry_and_busy_set_once(r: Redis) -> None:
    await leftovers(r, 3, prefix="old")
    await r.delete(keys.QUEUES, keys.QUEUES_BACKFILLED)  # data from before the registry
    await r.xadd(keys.stream("old00001", 4), {"task_id": "x"})
    await r.xadd(keys.stream("bare", 0), {"task_id": "y"})  # recreated without group
    await r.set("dtq:stream:audit-not-a-band", "1")
    assert await groups.backfill_registry(r) is True
    assert await r.zrange(keys.QUEUES, 0, -1) == [b"bare", b"old00000", b"old00001",
                                                  b"old00002"]
    assert await r.smembers(keys.BUSY_QUEUES) == {b"bare", b"old00001"}
    await r.delete(keys.BUSY_QUEUES)
    assert await groups.backfill_registry(r) is False  # the marker says it was done
    assert not await r.exists(keys.BUSY_QUEUES)


async def test_each_leadership_checks_the_backfill_marker_once(r: Redis) -> None:
    lock = LeaderLock(r, "gw")
    reaper = Reaper(r, Settings(gateway_id="gw", visibility_timeout_s=VT_S,
                                heartbeat_interval_s=0.5), lock)
    await r.xadd(keys.stream("old", 2), {"task_id": "x"})
    await reaper.tick()
    assert await r.smembers(keys.BUSY_QUEUES) == {b"old"}
    await r.delete(keys.QUEUES_BACKFILLED, keys.BUSY_QUEUES, keys.QUEUES)
    await reaper.tick()  # checked in this leadership already: no SCAN
    assert not await r.exists(keys.QUEUES_BACKFILLED)
    reaper.leadership_started()
    await reaper.tick()
    assert await r.smembers(keys.BUSY_QUEUES) == {b"old"}
    assert await r.zrange(keys.QUEUES, 0, -1) == [b"old"]


@pytest.mark.parametrize("used_again", ["schedule", "busy", "stream", None])
async def test_leaving_the_registry_keeps_a_queue_used_again_meanwhile(r: Redis,
                                                                       used_again) -> None:
    """Between a delete script and its ZREM, an enqueue through another replica may use
    the name again: a delayed task writes only the schedule and the busy marker (its
    ZADD NX to the registry found the name still there), so those count as a use too."""
    from dtq_gateway.store import idle_queues

    await r.zadd(keys.QUEUES, {"again": 0})
    if used_again == "schedule":
        await r.zadd(keys.schedule("again"), {"t-1": 1})
    elif used_again == "busy":
        await r.set(keys.busy_marker("again"), "1")
    elif used_again == "stream":
        await r.xadd(keys.stream("again", 5), {"task_id": "t-1"})
    await idle_queues.leave_registry(r, "again")
    assert (await r.zscore(keys.QUEUES, "again") is not None) == (used_again is not None)
