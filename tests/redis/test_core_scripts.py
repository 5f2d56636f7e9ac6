"""The data-path Lua scripts against a real redis-server, through their Python wrappers.

Each test seeds state through enqueue/lease, acts, then reads Redis back.
"""

from __future__ import annotations

import json
import time

import pytest
import redis.asyncio as aioredis

from dtq_gateway.domain.validation import validate_enqueue
from dtq_gateway.events.events_wire import decode
from dtq_gateway.leasing.completion import Completion
from dtq_gateway.leasing.dispatch import Dispatcher
from dtq_gateway.leasing.sessions import Session
from dtq_gateway.store import bulk, keys
from dtq_gateway.store.broker import CHUNK, Broker
from dtq_gateway.store.completion import ACK_CHUNK, FAIL
from dtq_gateway.store.groups import Groups
from dtq_gateway.store.scripts import Script
from dtq_proto import dtq_pb2 as pb
from tests.conftest import gateway_settings
from tests.support.leasing import resign
from tests.support.seed import read_by_hand, snapshot_queue


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
        self.dispatcher.reader.stale_after_ms = 0  # no worker records here; see the stale test

    async def enqueue(self, **kw) -> str:
        req = pb.EnqueueRequest(queue=kw.pop("queue", "q"), task_type=kw.pop("task_type", "t"),
                                **kw)
        (out,) = await self.broker.enqueue_many([validate_enqueue(req, self.settings)])
        return out.task_id

    async def lease(self, worker="w1", queues=("q",), max_in_flight=10) -> list[pb.LeasedTask]:
        # concurrency = max_in_flight: one read takes up to max_in_flight (at most
        # BATCH_MAX) and the stream's unread window does not bind
        session = Session(worker_id=worker, queues=list(queues), max_in_flight=max_in_flight,
                          concurrency=max_in_flight)
        await self.dispatcher.lease_now(session)
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


async def test_enqueue_writes_live_hash_without_ttl_and_entry(env):
    tid = await env.enqueue(priority=3, payload=b'{"x":1}', idempotency_key="k")
    assert await env.status(tid) == "queued"
    assert await env.redis.ttl(keys.task(tid)) == -1, "a live task record must not expire"
    entries = await env.redis.xrange(keys.stream("q", 3))
    fields = entries[0][1]
    assert set(fields) == {b"task_id", b"queue", b"task_type", b"payload", b"attempt",
                           b"max_attempts", b"priority", b"timeout_ms", b"idempotency_key",
                           b"idem_digest"}
    assert fields[b"idem_digest"] == keys.idempotency_digest("k").encode()
    idem = keys.idempotency("q", keys.idempotency_digest("k"))
    assert json.loads(await env.redis.get(idem))["state"] == "processing"
    assert await env.redis.ttl(idem) == -1, "a live task's idempotency record must not expire"


async def test_recent_index_is_trimmed(redis_url):
    e = Env(redis_url, recent_max=3)
    for _ in range(5):
        await e.enqueue()
    assert await e.redis.zcard(keys.RECENT_TASKS) == 3
    await e.redis.aclose()


async def test_delayed_enqueue_is_scheduled_not_streamed(env):
    tid = await env.enqueue(delay_ms=60_000)
    assert await env.status(tid) == "scheduled"
    assert await env.redis.zscore(keys.schedule("q"), tid) is not None
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
    rec = json.loads(await env.redis.get(idem))
    assert rec["state"] == "completed"
    # the terminal state starts the expiry recorded at enqueue (enqueue + DTQ_IDEM_TTL_S)
    assert 0 < await env.redis.ttl(idem) <= env.settings.idem_ttl_s
    assert rec["expires_at_ms"] == int(await env.redis.hget(keys.task(tid), "created_at_ms")) \
        + env.settings.idem_ttl_s * 1000
    # the retention clock of the record starts at the terminal state
    assert 0 < await env.redis.ttl(keys.task(tid)) <= env.settings.task_retention_s


async def test_empty_result_stores_no_key(env):
    tid = await env.enqueue()
    (task,) = await env.lease()
    (oc,) = await env.completion.ack([pb.AckItem(lease_id=task.lease_id)])
    assert oc.status == "succeeded"
    assert await env.redis.exists(keys.result(tid)) == 0


async def test_double_ack_is_duplicate_and_changes_nothing(env):
    tid = await env.enqueue()
    (task,) = await env.lease()
    await env.completion.ack([pb.AckItem(lease_id=task.lease_id, result=b"1")])
    before = await env.redis.hgetall(keys.task(tid))
    (oc,) = await env.completion.ack([pb.AckItem(lease_id=task.lease_id, result=b"2")])
    assert oc.duplicate and oc.error is None
    after = await env.redis.hgetall(keys.task(tid))
    assert before == after and await env.redis.get(keys.result(tid)) == b"1"


RECLAIM = Script("reclaim", helpers=("_finished", "_concurrency"))


async def _reaper_claims(env, task: pb.LeasedTask) -> str:
    """Claim a lease's entry to the reaper consumer, as autoclaim.lua does once the
    visibility timeout passed; returns the entry id."""
    entry = task.lease_id.split("|")[4]
    await env.redis.xclaim(keys.stream("q", 5), keys.GROUP, keys.REAPER_CONSUMER, 0, [entry])
    return entry


async def _reclaim(env, task: pb.LeasedTask, entry: str) -> bytes:
    return await RECLAIM(env.redis, [keys.stream("q", 5), keys.task(task.task_id),
                                     keys.dead_letter("q"), keys.cancelled("q")],
                         Script.argv(entry, task.attempt, 100, 3600, keys.GROUP,
                                     keys.REAPER_CONSUMER))


async def test_ack_after_reclaim_is_stale(env):
    tid = await env.enqueue(max_attempts=3)
    (task,) = await env.lease(worker="w1")
    assert await _reclaim(env, task, await _reaper_claims(env, task)) == b"retried"
    (oc,) = await env.completion.ack([pb.AckItem(lease_id=task.lease_id)])
    assert oc.error is not None and oc.error.reason == "STALE_LEASE"
    assert (await env.status(tid), await env.redis.hget(keys.task(tid), "attempt")) == (
        "queued", b"2")
    assert await env.redis.xlen(keys.stream("q", 5)) == 1  # only the retry's entry


async def test_ack_between_the_reapers_claim_and_its_reclaim_wins(env):
    """The record decides the fencing: a worker that finishes after the reaper claimed its
    expired entry but before reclaim.lua ran completes the task once; the reclaim then
    finds the entry gone from the PEL and changes nothing (no second run)."""
    tid = await env.enqueue(max_attempts=3)
    (task,) = await env.lease(worker="w1")
    entry = await _reaper_claims(env, task)
    (oc,) = await env.completion.ack([pb.AckItem(lease_id=task.lease_id)])
    assert oc.error is None and oc.status == "succeeded"
    assert await _reclaim(env, task, entry) == b"not_owned"
    assert await env.status(tid) == "succeeded"
    assert await env.redis.xlen(keys.stream("q", 5)) == 0


async def test_ack_by_another_worker_id_is_stale(env):
    tid = await env.enqueue()
    (task,) = await env.lease(worker="w1")
    forged = resign(task.lease_id, worker_id="w2")  # signed: the script fences it
    (oc,) = await env.completion.ack([pb.AckItem(lease_id=forged)])
    assert oc.error is not None and oc.error.reason == "STALE_LEASE"
    assert await env.status(tid) == "active"


async def test_fail_backoff_is_full_jitter_from_the_task_policy(env):
    tid = await env.enqueue(retry_policy=pb.RetryPolicy(backoff_base_ms=1000,
                                                        backoff_cap_ms=3000), max_attempts=5)
    (task,) = await env.lease()
    le = task.lease_id.split("|")
    sec, usec = await env.redis.time()
    now_before = int(sec) * 1000 + int(usec) // 1000  # ms: a whole second may pass next
    reply = await FAIL(env.redis, [keys.stream("q", 5), keys.task(tid), keys.dead_letter("q"),
                                   keys.schedule("q"), keys.task(tid)],
                       Script.argv(keys.GROUP, le[4], 1, "w1", tid, "failure", "1", 0, 0.5,
                                   "boom", "E", 100, 3600, "0", "q:5:-"))
    assert reply[0] == b"retry"
    due = int(reply[3])
    # attempt 1: ceiling = min(3000, 1000 * 2^0) = 1000, u = 0.5 -> 500 ms
    assert now_before + 500 <= due <= now_before + 1000 + 500
    assert await env.redis.hget(keys.task(tid), "attempt") == b"2"
    assert await env.redis.zscore(keys.schedule("q"), tid) == due


async def test_worker_retry_after_wins_over_backoff(env):
    tid = await env.enqueue(max_attempts=5)
    (task,) = await env.lease()
    (oc,) = await env.completion.fail([pb.FailItem(lease_id=task.lease_id, retry_after_ms=42_000)])
    now = int((await env.redis.time())[0]) * 1000
    due = await env.redis.zscore(keys.schedule("q"), tid)
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


async def test_activate_run_twice_keeps_the_entry_in_the_pel(env):
    """A client that re-sends an activate call after losing its reply (a retried
    pipeline) must not ack the entry away: the task would stay active with nothing left
    to reclaim it. The same consumer gets the same lease again; another gets nothing."""
    tid = await env.enqueue()
    session = Session(worker_id="w1", queues=["q"], max_in_flight=10)
    stream = keys.stream("q", 5)
    read = await read_by_hand(env.redis, "w1", "q", 5)
    assert await env.dispatcher.activator.deliver(session, read) == 1
    first = session.out.get_nowait()
    assert await env.dispatcher.activator.deliver(session, read) == 1
    again = session.out.get_nowait()
    assert (again.task_id, again.attempt) == (first.task_id, first.attempt) == (tid, 1)
    other = Session(worker_id="w2", queues=["q"], max_in_flight=10)
    assert await env.dispatcher.activator.deliver(other, read) == 0
    assert await env.status(tid) == "active"
    snap = await snapshot_queue(env.redis, "q")
    assert snap.tasks == {tid: "active"} and [c for _, c in snap.pel[5]] == ["w1"]
    assert await env.redis.xlen(stream) == 1


async def test_activate_expires_a_task_past_its_deadline(env):
    tid = await env.enqueue(expires_at_ms=int(time.time() * 1000) - 1000)  # just past
    assert await env.lease() == []
    assert await env.status(tid) == "expired"
    assert await env.redis.xlen(keys.stream("q", 5)) == 0


async def test_cancel_of_an_unread_queued_task_deletes_its_entry_at_once(env):
    """Depth, the depth gate and the backlog age count live tasks only."""
    tid = await env.enqueue()
    assert await env.broker.cancel(tid, "tester", "req-1", "why") == "cancelled"
    assert await env.redis.xlen(keys.stream("q", 5)) == 0
    assert not await env.redis.sismember(keys.cancelled("q"), tid)
    assert await env.lease() == []
    audit = await env.redis.xrange(keys.AUDIT)
    assert audit[0][1][b"action"] == b"cancel_task" and audit[0][1][b"actor"] == b"tester"


async def test_cancel_of_an_entry_already_read_is_acked_away_at_activation(env):
    """An entry read just before the cancel and not yet activated (the two-step path)
    stays for activate.lua, which acks it away and clears the cancelled set."""
    tid = await env.enqueue()
    session = Session(worker_id="w1", queues=["q"], max_in_flight=10)
    read = await read_by_hand(env.redis, "w1", "q", 5)
    assert await env.broker.cancel(tid, "tester", "req-1", "why") == "cancelled"
    assert await env.redis.sismember(keys.cancelled("q"), tid)
    assert await env.dispatcher.activator.deliver(session, read) == 0
    assert not await env.redis.sismember(keys.cancelled("q"), tid)
    assert await env.redis.xlen(keys.stream("q", 5)) == 0
    assert await env.status(tid) == "cancelled"



async def test_a_repeated_cancel_of_a_running_task_pushes_one_notice(env):
    """CancelTask on an ACTIVE task publishes the internal TASK_CANCEL_REQUESTED (the Lease
    stream notice) once: a repeated call, single or bulk, only answers "requested"."""
    tid = await env.enqueue()
    assert len(await env.lease()) == 1
    pubsub = env.redis.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(keys.EVENTS_CHANNEL)
    for _ in range(2):
        assert await env.broker.cancel(tid, "tester", "req-1", "why") == "requested"
        flt = bulk.TaskFilter(queue="q", statuses=frozenset({"active"}))
        got = await bulk.cancel_matching(env.redis, flt, dry_run=False, limit=10,
                                         task_retention_s=60)
        assert got.requested == 1
    marker = await env.enqueue()  # published after the cancels: the end of what to read
    types = []
    deadline = time.monotonic() + 5.0
    while marker not in {e["task_id"] for e in types} and time.monotonic() < deadline:
        msg = await pubsub.get_message(timeout=0.2)
        if msg is not None:
            types += decode(msg["data"]) or []
    await pubsub.aclose()
    assert [e["type"] for e in types if e["task_id"] == tid] == ["TASK_CANCEL_REQUESTED"]

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
    await env.dispatcher.lease_now(session)
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


async def test_enqueue_recreates_a_vanished_stream_with_its_group(env):
    await env.enqueue()
    await env.redis.flushall()
    await env.enqueue()  # the groups are cached as present; the stream is gone
    groups = await env.redis.xinfo_groups(keys.stream("q", 5))
    assert [g["name"] for g in groups] == [keys.GROUP.encode()]
    assert len(await env.lease()) == 1


async def test_lease_recreates_groups_of_a_bare_stream(env):
    tid = await env.enqueue()
    ((_, fields),) = await env.redis.xrange(keys.stream("q", 5))
    await env.redis.delete(*keys.queue_streams_desc("q"))
    # a stream recreated without its group (e.g. a retry moved back after FLUSHALL)
    entry_id = await env.redis.xadd(keys.stream("q", 5), fields)
    await env.redis.hset(keys.task(tid), "entry_id", entry_id)
    assert await env.lease() == []  # NOGROUP answered, groups forgotten
    assert [t.task_id for t in await env.lease()] == [tid]


async def test_worker_without_recent_heartbeat_gets_no_lease(env):
    await env.enqueue()
    env.dispatcher.reader.stale_after_ms = 1000
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
    forged_id = resign(task.lease_id, **({"attempt": 9} if change == "attempt"
                                         else {"worker_id": "w2"}))
    (forged,) = await env.completion.ack([pb.AckItem(lease_id=forged_id, result=b"3")])
    assert not forged.duplicate and forged.error is not None
    assert forged.error.reason == "STALE_LEASE"
    assert await env.redis.get(keys.result(tid)) == b"1"


async def test_one_events_message_per_script_call(env):
    """A chunk of 100 enqueues publishes ONE message carrying its 100 TASK_QUEUED events;
    the events keep distinct ids and the call's Redis time."""
    pubsub = env.redis.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(keys.EVENTS_CHANNEL)
    reqs = [validate_enqueue(pb.EnqueueRequest(queue="q", task_type="t", payload=b"{}"),
                             env.settings) for _ in range(CHUNK + 20)]
    out = await env.broker.enqueue_many(reqs)
    messages = []
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and len(messages) < 3:
        msg = await pubsub.get_message(timeout=0.2)  # None also for the subscribe reply
        if msg is not None:
            messages.append(msg["data"])
        elif len(messages) == 2:
            break  # a quiet 0.2 s after the second message: no third one came
    assert len(messages) == 2, f"expected one message per call (2), got {len(messages)}"
    await pubsub.aclose()
    batches = [decode(m) or [] for m in messages]
    assert [len(b) for b in batches] == [CHUNK, 20]
    events = batches[0] + batches[1]
    assert [e["task_id"] for e in events] == [o.task_id for o in out]
    assert {e["type"] for e in events} == {"TASK_QUEUED"}
    assert len({e["event_id"] for e in events}) == CHUNK + 20
    assert len({e["ts"] for e in batches[0]}) == 1


#: both ways a session is read: worker_check + lease_take (Redis Cluster) and one
#: lease_take that checks the worker itself (standalone or Sentinel Redis)
BY_SLOT = pytest.mark.parametrize("read_by_slot", [True, False], ids=["cluster", "standalone"])


@BY_SLOT
async def test_a_stalled_worker_session_peeks_and_leaves_tasks_untouched(env, read_by_slot):
    """Once a check said the worker is stalled, its session's reads take nothing (no
    activation and release per tick); the first read after its heartbeat takes."""
    tid = await env.enqueue()
    env.dispatcher.reader.stale_after_ms = 1000
    await env.completion.worker_event("w1", "host", "started")
    await env.redis.hset(keys.worker("w1"), "last_heartbeat", 1)  # long ago
    session = Session(worker_id="w1", queues=["q"], max_in_flight=10, stalled=True,
                      read_by_slot=read_by_slot)
    assert await env.dispatcher.lease_now(session) == (0, False, 0, False)
    assert session.stalled and session.out.empty()
    record = await env.redis.hgetall(keys.task(tid))
    assert (record[b"status"], record[b"started_at_ms"]) == (b"queued", b"0")
    assert not any(k.startswith(b"att:") for k in record)  # no attempt recorded
    snap = await snapshot_queue(env.redis, "q")
    assert snap.pel == {} and snap.tasks == {tid: "queued"}
    await env.completion.heartbeat(pb.HeartbeatRequest(worker_id="w1"))
    assert (await env.dispatcher.lease_now(session))[0] == 1
    assert not session.stalled and session.out.get_nowait().task_id == tid


@BY_SLOT
async def test_a_read_that_comes_back_with_a_stalled_check_hands_its_leases_back(
        env, read_by_slot):
    """lease_take ran in the same round trip as the check that says the worker is
    stalled: what it leased is released, back in its band, no attempt spent (a
    lease_take that checks the worker itself leases nothing at all)."""
    tid = await env.enqueue()
    env.dispatcher.reader.stale_after_ms = 1000
    await env.completion.worker_event("w1", "host", "started")
    await env.redis.hset(keys.worker("w1"), "last_heartbeat", 1)  # long ago
    session = Session(worker_id="w1", queues=["q"], max_in_flight=10,
                      read_by_slot=read_by_slot)
    assert (await env.dispatcher.lease_now(session))[0] == 0
    assert session.stalled and session.out.empty()
    snap = await snapshot_queue(env.redis, "q")
    assert snap.tasks == {tid: "queued"} and snap.pel == {} and len(snap.streams[5]) == 1
    assert await env.redis.hget(keys.task(tid), "attempt") == b"1"


@BY_SLOT
async def test_a_standalone_read_checks_its_worker_in_its_one_script_call(env, read_by_slot):
    """On a standalone Redis one lease_take call checks the worker and leases (one
    EVALSHA, one TIME per read); on a cluster worker_check is a call of its own. A
    draining worker's read leases nothing and ends its stream either way."""
    async def calls() -> tuple[int, int]:
        stats = await env.redis.info("commandstats")
        return stats["cmdstat_evalsha"]["calls"], stats["cmdstat_time"]["calls"]

    env.dispatcher.reader.stale_after_ms = 60_000
    await env.completion.heartbeat(pb.HeartbeatRequest(worker_id="w1"))
    tid = await env.enqueue()
    session = Session(worker_id="w1", queues=["q"], max_in_flight=10,
                      read_by_slot=read_by_slot)
    env.dispatcher.register(session)
    await env.groups.ensure(env.redis, ["q"])
    before = await calls()
    assert (await env.dispatcher.lease_now(session))[0] == 1
    after = await calls()
    assert (after[0] - before[0], after[1] - before[1]) == ((2, 2) if read_by_slot else (1, 1))
    assert session.out.get_nowait().task_id == tid
    other = await env.enqueue()
    await env.redis.hset(keys.worker("w1"), "status", "draining")
    assert await env.dispatcher.lease_now(session) == (0, False, 0, False)
    assert session.closed and session.worker_draining and session.out.get_nowait() is None
    assert await env.status(other) == "queued"
