"""Scheduler leadership, hand-over, the leader's duties end to end, and the worker sweep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from prometheus_client import REGISTRY
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from dtq_gateway.duties.leader import LeaderLock
from dtq_gateway.duties.scheduler import Scheduler, WorkerSweep
from dtq_gateway.settings import Settings
from dtq_gateway.store import keys
from tests.redis.sched_support import (
    Events,
    r,
    redis_ms,
    seed_lease,
    seed_task,
    task_fields,
    wait_until,
)
from tests.support.redis_server import free_port, port_held

__all__ = ["r"]

TTL_MS = 3000  # lock TTL of the fast hand-over tests


def settings(gateway_id: str, **kw: float) -> Settings:
    base = {"visibility_timeout_s": 0.2, "heartbeat_interval_s": 0.1,
            "scheduler_interval_ms": 50}
    base.update(kw)
    return Settings(gateway_id=gateway_id, **base)  # type: ignore[arg-type]


@pytest.fixture
async def schedulers(r: Redis) -> AsyncIterator[list[tuple[Scheduler, asyncio.Task[None]]]]:
    """Two running schedulers (fast lock timings) on the same Redis."""
    running = []
    for gid in ("gw-a", "gw-b"):
        s = Scheduler(r, settings(gid), lock_ttl_ms=TTL_MS, refresh_interval_s=0.5,
                      acquire_interval_s=0.3)
        running.append((s, asyncio.create_task(s.run())))
    yield running
    for s, task in running:
        await s.stop()
        await asyncio.wait_for(task, 5)


def leaders(running: list[tuple[Scheduler, asyncio.Task[None]]]) -> list[Scheduler]:
    return [s for s, _ in running if s.is_leader]


async def test_two_schedulers_elect_exactly_one_leader(r: Redis, schedulers) -> None:
    await wait_until(lambda: leaders(schedulers))
    [leader] = leaders(schedulers)
    value = (await r.get(keys.SCHEDULER_LOCK)).decode()
    assert value == leader.lock.token and value.split(":")[0] in {"gw-a", "gw-b"}
    # Followers keep retrying; for a full refresh period there stays exactly one leader.
    deadline, sample_s = time.monotonic() + 0.8, 0.05
    while time.monotonic() < deadline:  # sample the leadership over the whole period
        assert leaders(schedulers) == [leader]
        await asyncio.sleep(sample_s)


async def test_follower_takes_over_after_leader_stops(r: Redis, schedulers) -> None:
    await wait_until(lambda: leaders(schedulers))
    [old] = leaders(schedulers)
    old_token = old.lock.token.encode()
    stopped_at = time.monotonic()
    await old.stop()
    assert await r.get(keys.SCHEDULER_LOCK) != old_token  # released, not left to expire
    [new] = await wait_until(lambda: leaders(schedulers), timeout_s=TTL_MS / 1000)
    assert new is not old and time.monotonic() - stopped_at < TTL_MS / 1000
    assert (await r.get(keys.SCHEDULER_LOCK)).decode() == new.lock.token


async def test_deleted_lock_is_taken_over_within_ttl(r: Redis, schedulers) -> None:
    await wait_until(lambda: leaders(schedulers))
    await r.delete(keys.SCHEDULER_LOCK)

    async def one_consistent_leader() -> bool:
        value = await r.get(keys.SCHEDULER_LOCK)
        current = leaders(schedulers)
        return bool(value) and len(current) == 1 and current[0].lock.token == value.decode()

    started = time.monotonic()
    await wait_until(one_consistent_leader, timeout_s=TTL_MS / 1000)
    assert time.monotonic() - started < TTL_MS / 1000


async def test_default_timings_hand_over_within_lock_ttl(r: Redis) -> None:
    a, b = Scheduler(r, settings("gw-a")), Scheduler(r, settings("gw-b"))
    ta = asyncio.create_task(a.run())
    await wait_until(lambda: a.is_leader)
    tb = asyncio.create_task(b.run())
    try:
        await a.stop()
        await asyncio.wait_for(ta, 5)
        started = time.monotonic()
        await wait_until(lambda: b.is_leader, timeout_s=10.0)
        assert time.monotonic() - started < 10.0
    finally:
        await b.stop()
        await asyncio.wait_for(tb, 5)
    assert await r.get(keys.SCHEDULER_LOCK) is None


async def test_start_and_stop_as_a_gateway_duty(r: Redis) -> None:
    s = Scheduler(r, settings("gw-a"))
    s.start()
    await wait_until(lambda: s.is_leader)
    started = time.monotonic()
    await s.stop()
    assert time.monotonic() - started < 2.0  # within the gateway's shutdown budget
    assert not s.is_leader and await r.get(keys.SCHEDULER_LOCK) is None
    assert all(t.done() for t in s._tasks)


async def test_leader_gauge_follows_the_lock(r: Redis) -> None:
    """dtq_scheduler_leader: 1 once a lone replica leads, 0 after a refresh finds the
    lock taken by another, 1 again once it is free, 0 after a graceful stop."""
    def gauge() -> float | None:
        return REGISTRY.get_sample_value("dtq_scheduler_leader")

    s = Scheduler(r, settings("gw-a"), lock_ttl_ms=TTL_MS, refresh_interval_s=0.2,
                  acquire_interval_s=0.2)
    task = asyncio.create_task(s.run())
    try:
        await wait_until(lambda: gauge() == 1)
        assert s.is_leader
        await r.set(keys.SCHEDULER_LOCK, "gw-b:x", px=60_000)  # another replica's lock
        await wait_until(lambda: gauge() == 0)
        assert not s.is_leader
        await r.delete(keys.SCHEDULER_LOCK)
        await wait_until(lambda: gauge() == 1)
    finally:
        await s.stop()
        await asyncio.wait_for(task, 5)
    assert gauge() == 0 and await r.get(keys.SCHEDULER_LOCK) is None


async def test_refresh_refused_ends_leadership(r: Redis) -> None:
    lock = LeaderLock(r, "gw-a", ttl_ms=TTL_MS)
    assert await lock.acquire() and await lock.refresh()
    assert 0 < await r.pttl(keys.SCHEDULER_LOCK) <= TTL_MS
    await r.set(keys.SCHEDULER_LOCK, "gw-b:x")
    assert not await lock.refresh()
    assert not lock.is_leader and lock.token is None
    assert not await lock.release()
    assert await r.get(keys.SCHEDULER_LOCK) == b"gw-b:x"  # never deletes a foreign lock


async def test_lapsed_leader_keeps_lock_still_holding_its_token(r: Redis) -> None:
    lock = LeaderLock(r, "gw-a", ttl_ms=TTL_MS)
    assert await lock.acquire()
    token = lock.token
    lock._valid_until = 0.0  # as if every refresh had failed until the local deadline
    assert not lock.is_leader and lock.token is None
    assert await lock.acquire() and lock.token == token  # CAS on its own token, no wait
    assert (await r.get(keys.SCHEDULER_LOCK)).decode() == token
    lock._valid_until = 0.0
    await r.set(keys.SCHEDULER_LOCK, "gw-b:x")
    assert not await lock.acquire() and lock.token is None


@pytest.mark.parametrize("decode_responses", [False, True])
async def test_leader_moves_due_tasks_and_reclaims_leases(r: Redis, redis_url: str,
                                                          decode_responses: bool) -> None:
    due = await seed_task(r, priority=4)
    await r.zadd(keys.schedule("emails"), {due: await redis_ms(r) - 1})
    await r.set(keys.busy_marker("emails"), "1")  # what enqueue.lua and the gateway do
    await r.sadd(keys.BUSY_QUEUES, "emails")
    lost = await seed_task(r, queue="other", max_attempts=2)
    await seed_lease(r, lost, "w-dead")
    client = Redis.from_url(redis_url, decode_responses=decode_responses)
    s = Scheduler(client, settings("gw-a"))
    async with Events(r) as ev:
        task = asyncio.create_task(s.run())
        try:
            await wait_until(lambda: s.mover.counts["moved"] == 1)
            await wait_until(lambda: s.reaper.counts["retried"] == 1)
        finally:
            await s.stop()
            await asyncio.wait_for(task, 5)
            await client.aclose()
        events = await ev.collect()
    assert (await task_fields(r, due))["status"] == "queued"
    assert await r.xlen(keys.stream("emails", 4)) == 1
    assert (await task_fields(r, lost))["attempt"] == "2"
    types = sorted(e["type"] for e in events)
    assert types == ["TASK_QUEUED", "TASK_RETRIED"]
    assert await r.get(keys.SCHEDULER_LOCK) is None
    # the reaper ran the one-time registry backfill; both queues hold an entry, so both
    # are busy: "other" its retry, "emails" the moved task
    assert await r.get(keys.QUEUES_BACKFILLED) == b"1"
    assert await r.smembers(keys.BUSY_QUEUES) == {b"emails", b"other"}
    # backfill: the streams that existed then ("emails" only once the mover ran)
    assert {b"other"} <= set(await r.zrange(keys.QUEUES, 0, -1)) <= {b"emails", b"other"}
    for key in await r.keys("*"):  # every key the duties wrote is bounded
        if key.startswith(b"dtq:task:"):  # live records have no TTL, terminal ones do
            live = await r.hget(key, "status") in (b"queued", b"scheduled", b"active")
            assert (await r.ttl(key) == -1) if live else (await r.ttl(key) > 0), key
        elif key in (keys.QUEUES_BACKFILLED.encode(), keys.BUSY_QUEUES.encode(),
                     keys.QUEUES.encode(), keys.DEAD_LETTER_QUEUES.encode(),
                     keys.busy_marker("emails").encode(), keys.busy_marker("other").encode()):
            pass  # a marker, and one member per queue
        elif key.startswith(keys.HISTORY.encode()):  # history samples: capped, expiring
            assert await r.type(key) == b"list" and await r.ttl(key) > 0, key
        elif key in (keys.queue_bands("emails").encode(), keys.queue_bands("other").encode()):
            # the band summary of a queue: a set that expires (docs/redis-layout.md)
            assert await r.type(key) == b"set" and await r.pttl(key) > 0, key
        elif key == keys.queue_counters("other").encode():
            # the queue's outcome counters: one field per outcome (the lost lease's retry)
            assert await r.hgetall(key) == {b"retried": b"1"}, key
        else:
            assert await r.type(key) == b"stream", key


async def test_stale_worker_sweep_emits_worker_stale_once(r: Redis) -> None:
    now = await redis_ms(r)
    await r.sadd(keys.WORKERS, "w-old", "w-gone", "w-fresh", "w-stopped")
    await r.hset(keys.worker("w-old"), mapping={"status": "alive", "last_heartbeat": now - 5000})
    await r.hset(keys.worker("w-fresh"), mapping={"status": "alive", "last_heartbeat": now})
    await r.hset(keys.worker("w-stopped"), mapping={"status": "stopped",
                                                    "last_heartbeat": now - 5000})
    for w in ("w-old", "w-fresh", "w-stopped"):
        await r.expire(keys.worker(w), 30)
    lock = LeaderLock(r, "gw-a")
    sweep = WorkerSweep(r, Settings(heartbeat_interval_s=1.0, gateway_id="gw-a"), lock)
    assert not sweep.active()
    async with Events(r) as ev:
        assert await sweep.sweep() == {"stale": 1, "removed": 1, "forgotten": 1, "ok": 1}
        assert await sweep.sweep() == {"ok": 2}
        await r.delete(keys.worker("w-stopped"))  # its hash expires later: no event
        assert await sweep.sweep() == {"ok": 2}
        stale = await ev.of_type("WORKER_STALE")
    assert sorted(e["worker_id"] for e in stale) == ["w-gone", "w-old"]
    assert await r.hget(keys.worker("w-old"), "status") == b"stale"
    assert 0 < await r.ttl(keys.worker("w-old")) <= 30  # TTL untouched
    assert sorted(await r.smembers(keys.WORKERS)) == [b"w-fresh", b"w-old"]


async def test_redis_outage_backs_off_instead_of_spinning() -> None:
    # No client-side retries: every command fails at once, so only the duty's own
    # backoff stands between an outage and a hot loop.
    port = free_port()
    with port_held(port):  # refused throughout: no other test's server can start there
        dead = Redis(port=port, socket_connect_timeout=0.2, socket_timeout=0.2,
                     retry=Retry(NoBackoff(), 0))
        s = Scheduler(dead, settings("gw-a"))
        task = asyncio.create_task(s.run())
        await asyncio.sleep(1.5)  # measuring window: how many attempts in 1.5 s
        failures = s.keeper.failures
        await s.stop()
        await asyncio.wait_for(task, 5)
        await dead.aclose()
    assert not s.is_leader
    assert 2 <= failures <= 10  # exponential backoff (0.1 s doubling), not a hot loop
