"""reap_queue.lua + reclaim.lua through the Reaper: a lost lease counts as an attempt."""

from __future__ import annotations

import collections
import json

import pytest
from redis.asyncio import Redis

from dtq_gateway.duties.leader import LeaderLock
from dtq_gateway.duties.reaper import CLAIM_COUNT, Reaper
from dtq_gateway.settings import Settings
from dtq_gateway.store import keys
from dtq_gateway.store.scripts import Script
from tests.redis.sched_support import (
    Events,
    r,
    redis_ms,
    seed_idem,
    seed_lease,
    seed_task,
    task_fields,
    wait_until,
)

__all__ = ["r"]

VT_S = 0.05  # visibility timeout of these tests: entries idle 50 ms are reclaimable
RECLAIM = Script("reclaim", helpers=("_finished", "_concurrency"))


@pytest.fixture
def reaper(r: Redis) -> Reaper:
    settings = Settings(visibility_timeout_s=VT_S, heartbeat_interval_s=0.01, gateway_id="gw")
    return Reaper(r, settings, LeaderLock(r, "gw"))


async def reap(reaper: Reaper, stream: str, outcome: str, n: int = 1) -> dict[str, int]:
    """Reap the stream's queue until `outcome` was counted n times (entries must idle
    VT_S first); the "drained" count (the queue left the busy set) is not returned."""
    seen: collections.Counter[str] = collections.Counter()
    parsed = keys.parse_stream(stream)
    assert parsed is not None

    async def step() -> bool:
        seen.update(await reaper.reap_queue(parsed[0]))
        return seen[outcome] >= n

    await wait_until(step)
    seen.pop("drained", None)
    return dict(seen)


async def pending_count(r: Redis, stream: str) -> int:
    return (await r.xpending(stream, keys.GROUP))["pending"]


async def test_lost_lease_with_attempts_left_is_retried_as_new_entry(r: Redis,
                                                                     reaper: Reaper) -> None:
    tid = await seed_task(r, attempt=1, max_attempts=3)
    stream, old_id = await seed_lease(r, tid, "w1")
    async with Events(r) as ev:
        assert await reap(reaper, stream, "retried") == {"retried": 1}
        retried = await ev.of_type("TASK_RETRIED")
    assert await r.xrange(stream, old_id, old_id) == []
    assert await pending_count(r, stream) == 0
    entries = await r.xrange(stream)
    assert len(entries) == 1
    new_id, fields = entries[0]
    assert fields[b"attempt"] == b"2" and fields[b"task_id"] == tid.encode()
    t = await task_fields(r, tid)
    assert t["status"] == "queued" and t["attempt"] == "2" and t["entry_id"] == new_id.decode()
    assert t["worker_id"] == "" and t["last_error_class"] == "LeaseExpired"
    att = json.loads(t["att:1"])
    assert att["outcome"] == "lease_expired" and att["worker_id"] == "w1"
    assert att["error_class"] == "LeaseExpired" and att["finished_at_ms"] >= att["started_at_ms"]
    assert len(retried) == 1 and retried[0]["attempt"] == 2 and retried[0]["worker_id"] == "w1"
    assert await r.hgetall(keys.queue_counters("emails")) == {b"retried": b"1"}  # once


async def test_lost_last_attempt_is_dead_lettered_as_lease_expired(r: Redis,
                                                                   reaper: Reaper) -> None:
    tid = await seed_task(r, attempt=3, max_attempts=3, idem_key="order-7", queue="billing")
    idem = await seed_idem(r, "billing", "order-7", tid, ttl_s=7000)
    stream, _ = await seed_lease(r, tid, "w9")
    before_ms = await redis_ms(r)
    async with Events(r) as ev:
        assert await reap(reaper, stream, "dead_lettered") == {"dead_lettered": 1}
        dead = await ev.of_type("TASK_DEAD_LETTERED")
    assert await r.xlen(stream) == 0 and await pending_count(r, stream) == 0
    [(dlq_id, f)] = await r.xrange(keys.dead_letter("billing"))
    f = {k.decode(): v.decode() for k, v in f.items()}
    assert f["task_id"] == tid and f["queue"] == "billing" and f["original_queue"] == "billing"
    assert f["attempts_made"] == "3" and f["attempt"] == "3" and f["max_attempts"] == "3"
    assert f["last_error_class"] == "LeaseExpired" and f["last_error"] == "lease expired"
    assert f["retryable"] == "0" and f["worker_id"] == "w9"
    assert f["idempotency_key"] == "order-7" and int(f["failed_at_ms"]) >= before_ms
    for name in ("task_type", "payload", "priority", "timeout_ms"):
        assert name in f
    t = await task_fields(r, tid)
    assert t["status"] == "dead_lettered" and t["dlq_entry_id"] == dlq_id.decode()
    assert t["last_error_class"] == "LeaseExpired" and t["entry_id"] == ""
    assert json.loads(await r.get(idem))["state"] == "failed"
    assert 6900 < await r.ttl(idem) <= 7000
    assert [e["metadata"]["error_class"] for e in dead] == ["LeaseExpired"]
    assert await r.hgetall(keys.queue_counters("billing")) == {b"dead_lettered": b"1"}


@pytest.mark.parametrize("change", ["newer_entry", "terminal", "missing"])
async def test_stale_entry_is_absorbed(r: Redis, reaper: Reaper, change: str) -> None:
    tid = await seed_task(r)
    stream, _ = await seed_lease(r, tid, "w1")
    if change == "newer_entry":
        await r.hset(keys.task(tid), mapping={"entry_id": "9999999999999-0", "attempt": 2})
    elif change == "terminal":
        await r.hset(keys.task(tid), "status", "succeeded")
    else:
        await r.delete(keys.task(tid))
    before = await task_fields(r, tid)
    async with Events(r) as ev:
        assert await reap(reaper, stream, "absorbed") == {"absorbed": 1}
        absorbed = await ev.of_type("TASK_DUPLICATE_ABSORBED")
    assert await r.xlen(stream) == 0 and await pending_count(r, stream) == 0
    assert await task_fields(r, tid) == before
    assert not await r.exists(keys.dead_letter("emails"))
    assert len(absorbed) == (0 if change == "missing" else 1)
    assert not await r.exists(keys.queue_counters("emails"))  # no attempt ended here


async def test_entries_deleted_while_pending_are_acked_away(r: Redis, reaper: Reaper) -> None:
    tid = await seed_task(r)
    stream, entry_id = await seed_lease(r, tid, "w1")
    await r.xadd(stream, {"task_id": "queued-behind"})  # the stream is not empty
    await r.xdel(stream, entry_id)
    assert await pending_count(r, stream) == 1
    assert await reap(reaper, stream, "deleted") == {"deleted": 1}
    assert await pending_count(r, stream) == 0
    assert (await task_fields(r, tid))["status"] == "active"  # nothing else touched
    assert await r.sismember(keys.BUSY_QUEUES, "emails")


async def test_entry_not_owned_by_reaper_is_refused(r: Redis) -> None:
    tid = await seed_task(r)
    stream, entry_id = await seed_lease(r, tid, "w1")
    before = await task_fields(r, tid)
    reply = await RECLAIM(r, [stream, keys.task(tid), keys.dead_letter("emails"), keys.cancelled("emails")],
                          RECLAIM.argv(entry_id, 1, 100, 3600, keys.GROUP,
                                       keys.REAPER_CONSUMER))
    assert reply == b"not_owned"
    assert await task_fields(r, tid) == before
    assert await pending_count(r, stream) == 1


async def test_fresh_lease_is_not_claimed(r: Redis) -> None:
    settings = Settings(visibility_timeout_s=60, heartbeat_interval_s=1, gateway_id="gw")
    reaper = Reaper(r, settings, LeaderLock(r, "gw"))
    tid = await seed_task(r)
    stream, _ = await seed_lease(r, tid, "w1")
    assert await reaper.reap_queue("emails") == {}
    assert (await r.xpending_range(stream, keys.GROUP, "-", "+", 10))[0]["consumer"] == b"w1"


async def test_cancel_requested_task_is_cancelled_not_retried(r: Redis, reaper: Reaper) -> None:
    tid = await seed_task(r, attempt=1, max_attempts=3)
    stream, _ = await seed_lease(r, tid, "w1")
    await r.hset(keys.task(tid), "cancel_requested", "1")
    await r.sadd(keys.cancelled("emails"), tid)
    async with Events(r) as ev:
        assert await reap(reaper, stream, "cancelled") == {"cancelled": 1}
        cancelled = await ev.of_type("TASK_CANCELLED")
    assert await r.xlen(stream) == 0 and await pending_count(r, stream) == 0
    assert (await task_fields(r, tid))["status"] == "cancelled"
    assert not await r.sismember(keys.cancelled("emails"), tid)
    assert [e["task_id"] for e in cancelled] == [tid]
    assert await r.hget(keys.queue_counters("emails"), "cancelled") == b"1"  # counted once


async def test_read_but_never_activated_entry_is_requeued_without_spending_attempt(
        r: Redis, reaper: Reaper) -> None:
    tid = await seed_task(r, attempt=2)
    stream, old_id = await seed_lease(r, tid, "w1")
    await r.hset(keys.task(tid), mapping={"status": "queued", "worker_id": ""})
    assert await reap(reaper, stream, "requeued") == {"requeued": 1}
    [(new_id, fields)] = await r.xrange(stream)
    assert new_id != old_id.encode() and fields[b"attempt"] == b"2"
    t = await task_fields(r, tid)
    assert t["status"] == "queued" and t["attempt"] == "2" and t["entry_id"] == new_id.decode()
    assert "att:2" not in t
    assert not await r.exists(keys.queue_counters("emails"))  # it never started


async def test_stream_without_group_is_skipped(r: Redis, reaper: Reaper) -> None:
    stream = keys.stream("orphan", 3)
    await r.xadd(stream, {"task_id": "x"})
    await r.sadd(keys.BUSY_QUEUES, "orphan", "nothing")
    assert await reaper.reap_queue("orphan") == {}
    assert await reaper.reap_queue("nothing") == {"drained": 1}
    assert await r.smembers(keys.BUSY_QUEUES) == {b"orphan"}


async def test_queue_leaves_busy_set_once_all_ten_streams_are_empty(r: Redis,
                                                                    reaper: Reaper) -> None:
    tid = await seed_task(r, attempt=3, max_attempts=3)
    stream, _ = await seed_lease(r, tid, "w1")
    await r.xadd(keys.stream("emails", 0), {"task_id": "other"})
    assert await reap(reaper, stream, "dead_lettered") == {"dead_lettered": 1}
    assert await r.sismember(keys.BUSY_QUEUES, "emails")  # p0 still holds an entry
    await r.delete(keys.stream("emails", 0))
    assert await reaper.reap_queue("emails") == {"drained": 1}
    assert not await r.exists(keys.BUSY_QUEUES)
    assert not await r.exists(keys.busy_marker("emails"))


async def test_long_pel_is_reaped_across_cursor_rounds(r: Redis, reaper: Reaper) -> None:
    n = CLAIM_COUNT * 2 + 17
    tids = [await seed_task(r, max_attempts=1) for _ in range(n)]
    streams = {(await seed_lease(r, tid, f"w{i % 4}"))[0] for i, tid in enumerate(tids)}
    [stream] = streams
    assert await reap(reaper, stream, "dead_lettered", n) == {"dead_lettered": n}
    assert await pending_count(r, stream) == 0 and await r.xlen(stream) == 0
    assert await r.xlen(keys.dead_letter("emails")) == n


async def test_tick_reaps_busy_queues_and_only_leader_reaps(r: Redis) -> None:
    settings = Settings(visibility_timeout_s=VT_S, heartbeat_interval_s=0.01, gateway_id="gw")
    lock = LeaderLock(r, "gw")
    reaper = Reaper(r, settings, lock)
    tid = await seed_task(r, queue="a.b", priority=9)
    await seed_lease(r, tid, "w1")
    await r.sadd(keys.BUSY_QUEUES, "bad name!")  # not a queue name: ignored
    assert not reaper.active()
    assert await reaper.busy_queues() == ["a.b"]
    assert await lock.acquire() and reaper.active()

    async def retried() -> bool:
        await reaper.tick()
        return reaper.counts["retried"] == 1

    await wait_until(retried)
    assert (await task_fields(r, tid))["attempt"] == "2"
