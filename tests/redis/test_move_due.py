"""move_due.lua and the Mover against a private Redis: atomic moves, each task once."""

from __future__ import annotations

import asyncio
import json

from redis.asyncio import Redis

from dtq_gateway.duties.leader import LeaderLock
from dtq_gateway.duties.scheduler import MOVE_BATCH, Mover
from dtq_gateway.settings import Settings
from dtq_gateway.store import keys
from dtq_gateway.store.scripts import Script
from tests.redis.sched_support import Events, r, redis_ms, seed_idem, seed_task, task_fields

__all__ = ["r"]

MOVE_DUE = Script("move_due")
RETENTION_S = 604800


async def schedule(r: Redis, task_id: str, in_ms: int, queue: str = "emails") -> None:
    """Put task_id in its queue's schedule due `in_ms` from Redis now (negative = past),
    and mark the queue busy (as enqueue.lua and the gateway do)."""
    await r.zadd(keys.schedule(queue), {task_id: await redis_ms(r) + in_ms})
    await r.set(keys.busy_marker(queue), "1")
    await r.sadd(keys.BUSY_QUEUES, queue)


async def move(r: Redis, task_id: str, with_stream: bool = True, queue: str = "emails") -> str:
    """Call move_due.lua the way Mover does; returns its reply."""
    t = await task_fields(r, task_id)
    ks = [keys.schedule(queue), keys.task(task_id)]
    if t and with_stream:
        ks += [keys.stream(t["queue"], int(t["priority"])), keys.expiring(t["queue"])]
        if t["idem_digest"]:
            ks.append(keys.idempotency(t["queue"], t["idem_digest"]))
    reply = await MOVE_DUE(r, ks, MOVE_DUE.argv("", task_id, RETENTION_S))
    return reply.decode()


async def test_due_task_moves_into_its_band_with_task_queued(r: Redis) -> None:
    tid = await seed_task(r, priority=7, attempt=2)
    await schedule(r, tid, -1000)
    async with Events(r) as ev:
        assert await move(r, tid) == "moved"
        queued = await ev.of_type("TASK_QUEUED")
    entries = await r.xrange(keys.stream("emails", 7))
    assert len(entries) == 1
    entry_id, fields = entries[0]
    assert fields[b"task_id"] == tid.encode() and fields[b"attempt"] == b"2"
    t = await task_fields(r, tid)
    assert t["status"] == "queued" and t["entry_id"] == entry_id.decode()
    assert t["due_at_ms"] == "0" and t["attempt"] == "2"
    assert await r.zcard(keys.schedule("emails")) == 0
    assert await r.exists(keys.busy_marker("emails"))  # still busy: the reaper watches it
    assert await r.ttl(keys.task(tid)) == -1  # live again: no TTL (an older one dropped)
    assert len(queued) == 1 and queued[0]["task_id"] == tid
    assert queued[0]["queue"] == "emails" and queued[0]["metadata"] == {"reason": "due"}


async def test_not_yet_due_task_is_untouched(r: Redis) -> None:
    tid = await seed_task(r)
    await schedule(r, tid, 60_000)
    before = await task_fields(r, tid)
    assert await move(r, tid) == "not_due"
    assert await task_fields(r, tid) == before
    assert await r.zscore(keys.schedule("emails"), tid) is not None
    assert not await r.exists(keys.stream("emails", 5))


async def test_double_move_is_impossible(r: Redis) -> None:
    tid = await seed_task(r)
    await schedule(r, tid, -1)
    replies = await asyncio.gather(move(r, tid), move(r, tid))
    assert sorted(replies) == ["moved", "not_due"]
    assert await move(r, tid) == "not_due"
    assert await r.xlen(keys.stream("emails", 5)) == 1


async def test_expired_task_expires_instead_of_moving(r: Redis) -> None:
    now = await redis_ms(r)
    tid = await seed_task(r, expires_at_ms=now - 1, idem_key="k-1")
    idem = await seed_idem(r, "emails", "k-1", tid, ttl_s=5000)
    await schedule(r, tid, -1)
    async with Events(r) as ev:
        assert await move(r, tid) == "expired"
        expired = await ev.of_type("TASK_EXPIRED")
    t = await task_fields(r, tid)
    assert t["status"] == "expired" and int(t["finished_at_ms"]) >= now
    assert await r.zcard(keys.schedule("emails")) == 0
    assert not await r.exists(keys.stream("emails", 5))
    assert json.loads(await r.get(idem))["state"] == "failed"
    assert 4900 < await r.ttl(idem) <= 5000  # KEEPTTL
    assert [e["task_id"] for e in expired] == [tid]


async def test_missing_hash_is_gone_and_unscheduled(r: Redis) -> None:
    gone = keys.new_task_id("emails")
    await schedule(r, gone, -1)
    assert await move(r, gone) == "gone"
    assert await r.zcard(keys.schedule("emails")) == 0


async def test_task_not_scheduled_is_skipped(r: Redis) -> None:
    tid = await seed_task(r, status="cancelled")
    await schedule(r, tid, -1)
    assert await move(r, tid) == "skipped"
    assert await r.zcard(keys.schedule("emails")) == 0
    assert (await task_fields(r, tid))["status"] == "cancelled"
    assert not await r.exists(keys.stream("emails", 5))


async def test_without_band_stream_the_script_changes_nothing(r: Redis) -> None:
    tid = await seed_task(r)
    await schedule(r, tid, -1)
    assert await move(r, tid, with_stream=False) == "retry"
    assert await r.zscore(keys.schedule("emails"), tid) is not None


async def test_mover_moves_every_due_task_in_one_tick(r: Redis) -> None:
    settings = Settings(gateway_id="gw-a")
    lock = LeaderLock(r, "gw-a")
    assert await lock.acquire()
    mover = Mover(r, settings, lock)
    due = [(await seed_task(r, queue=f"q{i % 3}", priority=i % 10), f"q{i % 3}")
           for i in range(3 * MOVE_BATCH + 50)]
    later = await seed_task(r)
    for tid, q in due:
        await schedule(r, tid, -5, queue=q)
    await schedule(r, later, 60_000)
    due = [tid for tid, _ in due]
    await r.script_flush()  # the pipelined calls must survive NOSCRIPT
    await mover.tick()
    assert mover.counts == {"moved": len(due)}
    assert await r.zrange(keys.schedule("emails"), 0, -1) == [later.encode()]
    assert all([await r.zcard(keys.schedule(q)) == 0 for q in ("q0", "q1", "q2")])
    total = 0
    for q in ("q0", "q1", "q2"):
        for band in range(10):
            total += await r.xlen(keys.stream(q, band))
    assert total == len(due)
    t = await task_fields(r, due[13])
    assert t["status"] == "queued"
    assert (await r.xrange(keys.stream("q1", 3)))[0][1][b"task_id"] in {d.encode() for d in due}


async def test_two_movers_move_each_task_once(r: Redis) -> None:
    # a leader that lost the lock but has not noticed yet keeps moving for a moment:
    # every move is one script that removes the member, so nothing moves twice
    settings = Settings(gateway_id="gw-a")
    lock = LeaderLock(r, "gw-a")
    assert await lock.acquire()
    movers = [Mover(r, settings, lock), Mover(r, settings, lock)]
    due = [await seed_task(r, queue="emails") for _ in range(300)]
    for tid in due:
        await schedule(r, tid, -5)
    await asyncio.gather(*(m.move_batch() for m in movers))
    moved = movers[0].counts["moved"] + movers[1].counts["moved"]
    await asyncio.gather(*(m.move_batch() for m in movers))
    moved = movers[0].counts["moved"] + movers[1].counts["moved"]
    assert moved == len(due)
    assert sum([await r.xlen(keys.stream("emails", b)) for b in range(10)]) == len(due)
