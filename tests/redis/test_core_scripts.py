"""The data-path Lua scripts against a real redis-server, through their Python wrappers.

Each test seeds state through enqueue/lease, acts, then reads Redis back.
"""

from __future__ import annotations

import json
import time

import pytest
import redis.asyncio as aioredis

from dtq_gateway import keys
from dtq_gateway.broker import CHUNK, Broker
from dtq_gateway.completion import ACK_CHUNK, FAIL, Completion
from dtq_gateway.dispatch import Dispatcher
from dtq_gateway.groups import Groups
from dtq_gateway.scripts import Script
from dtq_gateway.sessions import Session
from dtq_gateway.validation import validate_enqueue
from dtq_proto import dtq_pb2 as pb
from tests.conftest import gateway_settings


class Env:
    """Broker + Completion + Dispatcher on one Redis, without a gRPC server."""

    def __init__(self, url: str, **overrides) -> None:
        self.settings = gateway_settings(url, **overrides)
        self.redis = aioredis.Redis.from_url(url)
        self.groups = Groups()
        self.broker = Broker(self.redis, self.settings, self.groups)
        self.completion = Completion(self.redis, self.settings)

        async def release(ids):
            await self.completion.fail([pb.FailItem(lease_id=i, mode=pb.FAIL_MODE_RELEASE)
                                        for i in ids])
        self.dispatcher = Dispatcher(self.redis, self.settings, self.groups, release)
        self.dispatcher.stale_after_ms = 0  # no worker records here; see the stale test

    async def enqueue(self, **kw) -> str:
        req = pb.EnqueueRequest(queue=kw.pop("queue", "q"), task_type=kw.pop("task_type", "t"),
                                **kw)
        (out,) = await self.broker.enqueue_many([validate_enqueue(req, self.settings)])
        return out.task_id

    async def lease(self, worker="w1", queues=("q",), max_in_flight=10) -> list[pb.LeasedTask]:
        session = Session(worker_id=worker, queues=list(queues), max_in_flight=max_in_flight)
        await self.dispatcher._lease(session)
        out = []
        while not session.out.empty():
            out.append(session.out.get_nowait())
        return out

    async def status(self, task_id: str) -> str:
        return (await self.redis.hget(keys.task(task_id), "status")).decode()


@pytest.fixture
async def env(redis_url):
    e = Env(redis_url)
    yield e
    await e.redis.aclose()


async def test_enqueue_writes_hash_with_ttl_and_entry(env):
    tid = await env.enqueue(priority=3, payload=b'{"x":1}', idempotency_key="k")
    assert await env.status(tid) == "queued"
    ttl = await env.redis.ttl(keys.task(tid))
    assert 0 < ttl <= env.settings.task_retention_s
    entries = await env.redis.xrange(keys.stream("q", 3))
    fields = entries[0][1]
    assert set(fields) == {b"task_id", b"queue", b"task_type", b"payload", b"attempt",
                           b"max_attempts", b"priority", b"timeout_ms", b"idempotency_key"}
    idem = keys.idempotency("q", keys.idempotency_digest("k"))
    assert json.loads(await env.redis.get(idem))["state"] == "processing"
    assert 0 < await env.redis.ttl(idem) <= env.settings.idem_ttl_s


async def test_recent_index_is_trimmed(redis_url):
    e = Env(redis_url, recent_max=3)
    for _ in range(5):
        await e.enqueue()
    assert await e.redis.zcard(keys.RECENT_TASKS) == 3
    await e.redis.aclose()


async def test_delayed_enqueue_is_scheduled_not_streamed(env):
    tid = await env.enqueue(delay_ms=60_000)
    assert await env.status(tid) == "scheduled"
    assert await env.redis.zscore(keys.RETRY_SCHEDULE, tid) is not None
    assert sum([await env.redis.xlen(k) for k in keys.queue_streams_desc("q")]) == 0


async def test_ack_removes_entry_stores_result_and_completes_idempotency(env):
    tid = await env.enqueue(idempotency_key="k")
    (task,) = await env.lease()
    big = b"r" * (env.settings.result_max_bytes + 10)
    (oc,) = await env.completion.ack([pb.AckItem(lease_id=task.lease_id, result=big)])
    assert oc.status == "succeeded"
    assert await env.redis.xlen(keys.stream("q", 5)) == 0  # XACK and XDEL
    assert await env.redis.xpending(keys.stream("q", 5), keys.GROUP) == {
        "pending": 0, "min": None, "max": None, "consumers": []}
    assert len(await env.redis.get(keys.result(tid))) == env.settings.result_max_bytes
    assert await env.redis.hget(keys.task(tid), "result_truncated") == b"1"
    assert 0 < await env.redis.ttl(keys.result(tid)) <= env.settings.result_retention_s
    idem = keys.idempotency("q", keys.idempotency_digest("k"))
    ttl_before = await env.redis.ttl(idem)
    assert json.loads(await env.redis.get(idem))["state"] == "completed"
    assert ttl_before <= env.settings.idem_ttl_s  # KEEPTTL: not extended


async def test_double_ack_is_duplicate_and_changes_nothing(env):
    tid = await env.enqueue()
    (task,) = await env.lease()
    await env.completion.ack([pb.AckItem(lease_id=task.lease_id, result=b"1")])
    before = await env.redis.hgetall(keys.task(tid))
    (oc,) = await env.completion.ack([pb.AckItem(lease_id=task.lease_id, result=b"2")])
    assert oc.duplicate and oc.error is None
    after = await env.redis.hgetall(keys.task(tid))
    assert before == after and await env.redis.get(keys.result(tid)) == b"1"


async def test_ack_after_reclaim_is_stale(env):
    tid = await env.enqueue()
    (task,) = await env.lease(worker="w1")
    entry = task.lease_id.split("|")[4]
    # another consumer takes the entry over (what the reaper does after the timeout)
    await env.redis.xclaim(keys.stream("q", 5), keys.GROUP, "w2", 0, [entry])
    (oc,) = await env.completion.ack([pb.AckItem(lease_id=task.lease_id)])
    assert oc.error is not None and oc.error.reason == "STALE_LEASE"
    assert await env.status(tid) == "active"
    assert await env.redis.xlen(keys.stream("q", 5)) == 1


async def test_fail_backoff_is_full_jitter_from_the_task_policy(env):
    tid = await env.enqueue(retry_policy=pb.RetryPolicy(backoff_base_ms=1000,
                                                        backoff_cap_ms=3000), max_attempts=5)
    (task,) = await env.lease()
    le = task.lease_id.split("|")
    now_before = int((await env.redis.time())[0]) * 1000
    reply = await FAIL(env.redis, [keys.stream("q", 5), keys.task(tid), keys.DEAD_LETTER,
                                   keys.RETRY_SCHEDULE, keys.task(tid)],
                       Script.argv(keys.GROUP, le[4], 1, "w1", tid, "failure", "1", 0, 0.5,
                                   "boom", "E", 100, 3600, "0"))
    assert reply[0] == b"retry"
    due = int(reply[3])
    # attempt 1: ceiling = min(3000, 1000 * 2^0) = 1000, u = 0.5 -> 500 ms
    assert now_before + 500 <= due <= now_before + 1000 + 500
    assert await env.redis.hget(keys.task(tid), "attempt") == b"2"
    assert await env.redis.zscore(keys.RETRY_SCHEDULE, tid) == due


async def test_worker_retry_after_wins_over_backoff(env):
    tid = await env.enqueue(max_attempts=5)
    (task,) = await env.lease()
    (oc,) = await env.completion.fail([pb.FailItem(lease_id=task.lease_id, retry_after_ms=42_000)])
    now = int((await env.redis.time())[0]) * 1000
    due = await env.redis.zscore(keys.RETRY_SCHEDULE, tid)
    assert oc.kind == "retry" and now + 40_000 < due <= now + 43_000


async def test_activate_absorbs_stale_entry(env):
    tid = await env.enqueue()
    # a stale copy of the entry (older attempt) lands in the stream
    await env.redis.xadd(keys.stream("q", 9), {"task_id": tid, "queue": "q", "task_type": "t",
                                               "payload": "", "attempt": "0",
                                               "max_attempts": "3", "priority": "9",
                                               "timeout_ms": "1000", "idempotency_key": ""})
    tasks = await env.lease()
    assert [t.priority for t in tasks] == [5]
    assert await env.redis.xlen(keys.stream("q", 9)) == 0


async def test_activate_expires_a_task_past_its_deadline(env):
    tid = await env.enqueue(expires_at_ms=int(time.time() * 1000) - 1000)  # just past
    assert await env.lease() == []
    assert await env.status(tid) == "expired"
    assert await env.redis.xlen(keys.stream("q", 5)) == 0


async def test_cancelled_queued_task_is_acked_away_and_leaves_the_set(env):
    tid = await env.enqueue()
    assert await env.broker.cancel(tid, "tester", "req-1", "why") == "cancelled"
    assert await env.redis.sismember(keys.CANCELLED, tid)
    assert await env.lease() == []
    assert not await env.redis.sismember(keys.CANCELLED, tid)
    assert await env.redis.xlen(keys.stream("q", 5)) == 0
    audit = await env.redis.xrange(keys.AUDIT)
    assert audit[0][1][b"action"] == b"cancel_task" and audit[0][1][b"actor"] == b"tester"


async def test_paused_queue_leases_nothing(env):
    await env.enqueue()
    await env.redis.set(keys.paused("q"), "1")
    assert await env.lease() == []
    await env.redis.delete(keys.paused("q"))
    assert len(await env.lease()) == 1


async def test_task_type_filter_puts_other_types_back(env):
    await env.enqueue(task_type="a")
    b = await env.enqueue(task_type="b")
    session = Session(worker_id="w1", queues=["q"], max_in_flight=10,
                      task_types=frozenset({"b"}))
    await env.dispatcher._lease(session)
    got = [session.out.get_nowait().task_id for _ in range(session.out.qsize())]
    assert got == [b]
    assert await env.redis.xlen(keys.stream("q", 5)) == 2  # "a" re-added at the tail


async def test_heartbeat_extends_and_stops_after_timeout_plus_grace(redis_url):
    e = Env(redis_url, lease_grace_ms=0)
    await e.enqueue(timeout_ms=1)
    (task,) = await e.lease()
    await e.redis.hset(keys.task(task.task_id), "started_at_ms", 1)  # long ago
    lost, cancelled = await e.completion.heartbeat(pb.HeartbeatRequest(
        worker_id="w1", lease_ids=[task.lease_id]))
    assert lost == [task.lease_id] and cancelled == []
    await e.redis.aclose()


async def test_heartbeat_resets_idle_without_counting_a_delivery(env):
    await env.enqueue()
    (task,) = await env.lease()
    entry = task.lease_id.split("|")[4]
    lost, _ = await env.completion.heartbeat(pb.HeartbeatRequest(worker_id="w1",
                                                                 lease_ids=[task.lease_id]))
    assert lost == []
    (p,) = await env.redis.xpending_range(keys.stream("q", 5), keys.GROUP, entry, entry, 1)
    assert p["times_delivered"] == 1 and p["time_since_delivered"] < 1000


async def test_scripts_reload_after_script_flush(env):
    tid = await env.enqueue()
    (task,) = await env.lease()
    await env.redis.script_flush()
    (oc,) = await env.completion.ack([pb.AckItem(lease_id=task.lease_id)])  # pipeline path
    assert oc.status == "succeeded"
    tid2 = await env.enqueue()
    await env.redis.script_flush()
    assert await env.broker.cancel(tid2, "a", "r", "") == "cancelled"  # direct path
    assert await env.status(tid) == "succeeded"


async def test_lease_recreates_groups_after_flushall(env):
    await env.enqueue()
    await env.redis.flushall()
    await env.enqueue()  # the groups are cached as present, the stream is new
    assert await env.lease() == []  # NOGROUP answered, groups forgotten
    assert len(await env.lease()) == 1


async def test_worker_without_recent_heartbeat_gets_no_lease(env):
    await env.enqueue()
    env.dispatcher.stale_after_ms = 1000
    await env.completion.worker_event("w1", "host", "started")
    await env.redis.hset(keys.worker("w1"), "last_heartbeat", 1)  # long ago
    assert await env.lease() == []
    lost, _ = await env.completion.heartbeat(pb.HeartbeatRequest(worker_id="w1"))
    assert lost == []
    assert len(await env.lease()) == 1


async def test_idempotency_record_of_a_vanished_task_is_taken_over_at_once(env):
    first = await env.enqueue(idempotency_key="k")
    await env.redis.delete(keys.task(first))  # e.g. lost in a failover, or retention ran out
    second = await env.enqueue(idempotency_key="k")
    assert second != first
    idem = keys.idempotency("q", keys.idempotency_digest("k"))
    assert json.loads(await env.redis.get(idem))["task_id"] == second


async def test_idempotency_key_is_free_again_after_failure(env):
    first = await env.enqueue(idempotency_key="k", max_attempts=1)
    (task,) = await env.lease()
    (oc,) = await env.completion.fail([pb.FailItem(lease_id=task.lease_id, retryable=False)])
    assert oc.status == "dead_lettered"
    again = await env.enqueue(idempotency_key="k")
    assert again != first


async def test_batches_span_several_script_calls_in_order(env):
    """More items than one script call takes (enqueue.CHUNK, completion.ACK_CHUNK): every
    item is answered in order, a duplicate idempotency key across the chunk boundary is
    caught, and one Ack settles leases of every chunk."""
    n = CHUNK + ACK_CHUNK + 17
    reqs = [pb.EnqueueRequest(queue="q", task_type="t", payload=str(i).encode(),
                              idempotency_key=f"k{i}" if i != CHUNK else "k0")
            for i in range(n)]
    outs = await env.broker.enqueue_many([validate_enqueue(r, env.settings) for r in reqs])
    assert [o.deduplicated for o in outs] == [i == CHUNK for i in range(n)]
    assert outs[CHUNK].task_id == outs[0].task_id
    fresh = [o.task_id for o in outs if not o.deduplicated]
    assert await env.redis.xlen(keys.stream("q", 5)) == n - 1
    tasks = await env.lease(max_in_flight=n)
    assert [t.task_id for t in tasks] == fresh  # stream order = enqueue order
    items = [pb.AckItem(lease_id=t.lease_id, result=t.payload) for t in tasks]
    items.insert(ACK_CHUNK, pb.AckItem(lease_id="not-a-lease"))
    outcomes = await env.completion.ack(items)
    assert outcomes[ACK_CHUNK].error is not None
    assert [o.status for o in outcomes if o.error is None] == ["succeeded"] * (n - 1)
    assert await env.redis.xlen(keys.stream("q", 5)) == 0
    assert await env.redis.get(keys.result(fresh[-1])) == tasks[-1].payload


@pytest.mark.parametrize("change", ["attempt", "worker"])
async def test_repeated_ack_with_another_attempt_or_worker_is_stale(env, change):
    """Only a repeat of the lease that finished the task is a duplicate: the same entry
    id with another attempt or worker id is a stale lease, and changes nothing."""
    tid = await env.enqueue()
    (task,) = await env.lease(worker="w1")
    (first,) = await env.completion.ack([pb.AckItem(lease_id=task.lease_id, result=b"1")])
    (again,) = await env.completion.ack([pb.AckItem(lease_id=task.lease_id, result=b"2")])
    assert first.status == "succeeded" and again.duplicate and again.status == "succeeded"
    parts = task.lease_id.split("|")
    parts[5 if change == "attempt" else 6] = "9" if change == "attempt" else "w2"
    (forged,) = await env.completion.ack([pb.AckItem(lease_id="|".join(parts), result=b"3")])
    assert not forged.duplicate and forged.error is not None
    assert forged.error.reason == "STALE_LEASE"
    assert await env.redis.get(keys.result(tid)) == b"1"
