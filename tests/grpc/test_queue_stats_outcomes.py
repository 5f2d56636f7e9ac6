"""GetQueueStats: the real age of a task no worker takes, the stuck task types, and the
queue's outcome counters (kept in Redis by the ack, fail, cancel and reclaim scripts)."""

from __future__ import annotations

import asyncio
import collections

import grpc
import pytest
import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from dtq_gateway.duties.leader import LeaderLock
from dtq_gateway.duties.reaper import Reaper
from dtq_gateway.settings import Settings
from dtq_gateway.store import keys
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.support.leasing import LeaseStream

POLL_S = 0.02  # poll interval, bounded by each poll's deadline


@pytest.fixture
async def admin_stub(channel):
    return dtq_pb2_grpc.AdminStub(channel)


async def _poll(predicate, timeout_s: float = 10.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (value := await predicate()):
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(POLL_S)
    return value


async def test_a_type_no_worker_takes_shows_its_real_age_and_is_stuck(
        gateway, broker_stub, admin_stub, redis_url):
    orphan = await broker_stub.Enqueue(pb.EnqueueRequest(queue="mix", task_type="orphan"))
    await broker_stub.Enqueue(pb.EnqueueRequest(queue="mix", task_type="known"))
    await asyncio.sleep(1.0)  # not synchronisation: the orphan must be 1 s old
    lease = await LeaseStream(broker_stub, "w-known", ["mix"], task_types=["known"]).open()
    known = await lease.next()
    assert known.task_type == "known"
    r = aioredis.from_url(redis_url)
    try:
        async def put_back() -> bool:  # the session read the orphan and put it back
            entries = await r.xrange(keys.stream("mix", 5))  # default priority 5
            return any(f.get(b"task_id") == orphan.task_id.encode() and b"queued_at" in f
                       for _, f in entries)
        await _poll(put_back)
    finally:
        await r.aclose()
    stats = await admin_stub.GetQueueStats(pb.GetQueueStatsRequest(queue="mix"))
    assert stats.oldest_task_age_ms >= 1000
    assert list(stats.stuck_task_types) == ["orphan"]
    (waiting,) = stats.waiting_types
    assert (waiting.task_type, waiting.waiting, waiting.taken) == ("orphan", 1, False)
    assert waiting.oldest_age_ms >= 1000 and stats.waiting_complete
    lease.close()


async def test_waiting_types_taken_by_a_worker_without_filter_are_not_stuck(
        gateway, broker_stub, admin_stub):
    await broker_stub.Enqueue(pb.EnqueueRequest(queue="open", task_type="anything"))
    stats = await admin_stub.GetQueueStats(pb.GetQueueStatsRequest(queue="open"))
    assert list(stats.stuck_task_types) == ["anything"]  # no worker leases from it yet
    lease = await LeaseStream(broker_stub, "w-all", ["open"], max_in_flight=1).open()
    await admin_stub.PauseQueue(pb.PauseQueueRequest(queue="open"))  # keep it waiting
    await broker_stub.Enqueue(pb.EnqueueRequest(queue="open", task_type="other"))
    stats = await admin_stub.GetQueueStats(pb.GetQueueStatsRequest(queue="open"))
    assert not stats.stuck_task_types
    lease.close()


async def test_outcome_counters_count_acks_retries_and_dead_letters(
        gateway, broker_stub, admin_stub):
    for kind in ("ok", "ok", "retry", "dead"):
        await broker_stub.Enqueue(pb.EnqueueRequest(queue="out", task_type=kind,
                                                    max_attempts=3))
    lease = await LeaseStream(broker_stub, "w-out", ["out"]).open()
    tasks = [await lease.next() for _ in range(4)]
    acks = [pb.AckItem(lease_id=t.lease_id) for t in tasks if t.task_type == "ok"]
    await broker_stub.Ack(pb.AckRequest(items=acks))
    await broker_stub.Fail(pb.FailRequest(items=[
        pb.FailItem(lease_id=t.lease_id, retryable=t.task_type == "retry",
                    retry_after_ms=60_000, error_class="E")
        for t in tasks if t.task_type != "ok"]))
    stats = await admin_stub.GetQueueStats(pb.GetQueueStatsRequest(queue="out"))
    assert (stats.succeeded, stats.failed, stats.retried, stats.dead_lettered,
            stats.cancelled) == (2, 2, 1, 1, 0)
    lease.close()


async def test_outcome_counters_count_each_cancel_once(gateway, broker_stub, admin_stub):
    """A CancelTask of a queued and of a scheduled task, a bulk CancelTasks and a cancel
    of a running task that its worker then reports: each cancelled task counts once, a
    repeated cancel of a task already cancelled not again."""
    def enqueue(task_type: str, delay_ms: int = 0):
        return broker_stub.Enqueue(pb.EnqueueRequest(queue="cx", task_type=task_type,
                                                     delay_ms=delay_ms))
    running = await enqueue("run")
    lease = await LeaseStream(broker_stub, "w-cx", ["cx"], max_in_flight=1).open()
    (started,) = await lease.take(1)
    assert started.task_id == running.task_id
    queued, scheduled = await enqueue("one"), await enqueue("one", 3_600_000)
    bulk = [await enqueue("bulk") for _ in range(2)]
    for task in (queued, scheduled, running):
        await broker_stub.CancelTask(pb.CancelTaskRequest(task_id=task.task_id))
    with pytest.raises(grpc.aio.AioRpcError) as again:
        await broker_stub.CancelTask(pb.CancelTaskRequest(task_id=queued.task_id))
    assert again.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    await broker_stub.CancelTask(pb.CancelTaskRequest(task_id=running.task_id))  # flag again
    done = await admin_stub.CancelTasks(pb.CancelTasksRequest(
        filter=pb.TaskFilter(queue="cx", task_type="bulk")))
    assert done.cancelled == len(bulk)
    stats = await admin_stub.GetQueueStats(pb.GetQueueStatsRequest(queue="cx"))
    assert stats.cancelled == 4  # the running task counts when it ends
    await broker_stub.Fail(pb.FailRequest(items=[pb.FailItem(lease_id=started.lease_id,
                                                             error_class="Cancelled")]))
    stats = await admin_stub.GetQueueStats(pb.GetQueueStatsRequest(queue="cx"))
    assert (stats.cancelled, stats.failed) == (5, 0)
    lease.close()


async def test_outcome_counters_count_lost_leases_once(gateway, broker_stub, admin_stub,
                                                      redis_url):
    """Leases whose visibility timeout ran out, ended by the reaper: the one with an
    attempt left counts once in retried, the one on its last attempt once in
    dead_lettered (so in failed too), as the reaper's metrics count them; reaping again
    counts nothing more."""
    queue = "lost-leases"
    for kind, attempts in (("retry", 2), ("dead", 1)):
        await broker_stub.Enqueue(pb.EnqueueRequest(queue=queue, task_type=kind,
                                                    max_attempts=attempts))
    lease = await LeaseStream(broker_stub, "w-lost", [queue], max_in_flight=2).open()
    await lease.take(2)
    await admin_stub.PauseQueue(pb.PauseQueueRequest(queue=queue))  # no second lease
    metric = {name: REGISTRY.get_sample_value(f"dtq_tasks_{name}_total", {"queue": queue})
              or 0.0 for name in ("retried", "dead_lettered", "failed")}
    r = aioredis.from_url(redis_url)
    reaper = Reaper(r, Settings(visibility_timeout_s=0.05), LeaderLock(r, "gw-test"))
    seen: collections.Counter[str] = collections.Counter()
    try:
        async def reaped() -> bool:  # entries idle 50 ms are reclaimable
            seen.update(await reaper.reap_queue(queue))
            return bool(seen["retried"] and seen["dead_lettered"])
        await _poll(reaped)
        seen.update(await reaper.reap_queue(queue))
    finally:
        await r.aclose()
    assert (seen["retried"], seen["dead_lettered"]) == (1, 1)
    stats = await admin_stub.GetQueueStats(pb.GetQueueStatsRequest(queue=queue))
    assert (stats.succeeded, stats.failed, stats.retried, stats.dead_lettered,
            stats.cancelled) == (0, 2, 1, 1, 0)
    after = {name: REGISTRY.get_sample_value(f"dtq_tasks_{name}_total", {"queue": queue})
             or 0.0 for name in metric}
    assert {name: after[name] - metric[name] for name in metric} == {
        "retried": 1, "dead_lettered": 1, "failed": 0}  # a lost lease is not a Fail
    lease.close()


async def test_stats_of_an_unknown_queue_stay_not_found(gateway, admin_stub):
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await admin_stub.GetQueueStats(pb.GetQueueStatsRequest(queue="nothing-here"))
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND
