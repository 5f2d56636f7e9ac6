"""The backlog counts live work only: tasks whose expiry passed before any worker
started them leave their bands (the scheduler leader expires them), so GetQueueStats'
depth and backlog age and ``dtq_queue_backlog_age_seconds`` drop to zero without a
worker ever reading them."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from dtq_gateway.duties.queue_gauges import QueueGaugeCollector
from dtq_gateway.store import keys
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.support.leasing import LeaseStream

POLL_S = 0.05  # poll interval, bounded by each poll's deadline


@pytest.fixture
async def admin_stub(channel):
    return dtq_pb2_grpc.AdminStub(channel)


async def _poll(predicate, timeout_s: float = 20.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (value := await predicate()):
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(POLL_S)
    return value


async def test_tasks_past_their_ttl_are_not_backlog(gateway, broker_stub, admin_stub,
                                                     redis_url):
    for _ in range(5):
        await broker_stub.Enqueue(pb.EnqueueRequest(queue="ttl", task_type="t", ttl_ms=300))
    live = await broker_stub.Enqueue(pb.EnqueueRequest(queue="ttl", task_type="t"))

    async def only_live_left():
        stats = await admin_stub.GetQueueStats(pb.GetQueueStatsRequest(queue="ttl"))
        return stats if sum(b.depth for b in stats.bands) == 1 else None
    stats = await _poll(only_live_left)
    assert stats.oldest_task_age_ms < 5_000  # the live task's own age only
    r = aioredis.from_url(redis_url)
    try:
        (entry,) = [f for _, f in await r.xrange(keys.stream("ttl", 5))]
        assert entry[b"task_id"] == live.task_id.encode()
        assert await r.zcard(keys.expiring("ttl")) == 0
        await QueueGaugeCollector(r, heartbeat_interval_ms=10_000).tick()
        depth = REGISTRY.get_sample_value("dtq_queue_depth", {"queue": "ttl", "band": "5"})
        assert depth == 1
    finally:
        await r.aclose()


async def test_five_tasks_with_300_ms_ttl_and_no_worker_leave_no_backlog(
        gateway, broker_stub, admin_stub, redis_url):
    expired_before = REGISTRY.get_sample_value("dtq_tasks_expired_total",
                                               {"queue": "short"}) or 0
    ids = [(await broker_stub.Enqueue(pb.EnqueueRequest(queue="short", task_type="t",
                                                        ttl_ms=300))).task_id
           for _ in range(5)]

    async def drained():
        stats = await admin_stub.GetQueueStats(pb.GetQueueStatsRequest(queue="short"))
        return stats if sum(b.depth for b in stats.bands) == 0 else None
    stats = await _poll(drained)
    assert stats.oldest_task_age_ms == 0
    for task_id in ids:
        task = await broker_stub.GetTask(pb.GetTaskRequest(task_id=task_id))
        assert task.task.status == pb.TASK_STATUS_EXPIRED
    # counted by the scheduler leader that expired them (this in-process gateway)
    assert REGISTRY.get_sample_value("dtq_tasks_expired_total",
                                     {"queue": "short"}) == expired_before + 5
    r = aioredis.from_url(redis_url)
    try:
        await QueueGaugeCollector(r, heartbeat_interval_ms=10_000).tick()
    finally:
        await r.aclose()
    age = REGISTRY.get_sample_value("dtq_queue_backlog_age_seconds", {"queue": "short"})
    assert age in (None, 0.0)


async def test_the_expiry_index_follows_each_task(gateway, broker_stub, redis_url):
    """dtq:expiring:{q} (docs/redis-layout.md): a started task leaves it at activation, a
    cancelled one once its expiry passes, a delayed one enters it when it comes due,
    and an entry a read already took is left to activate.lua."""
    r = aioredis.from_url(redis_url)
    index = keys.expiring("idx")
    try:
        started = await broker_stub.Enqueue(pb.EnqueueRequest(queue="idx", task_type="t",
                                                              ttl_ms=600_000))
        assert await r.zscore(index, started.task_id) is not None
        lease = await LeaseStream(broker_stub, "w-idx", ["idx"]).open()
        assert (await lease.next()).task_id == started.task_id
        assert await r.zscore(index, started.task_id) is None
        lease.close()

        cancelled = await broker_stub.Enqueue(pb.EnqueueRequest(queue="idx", task_type="t",
                                                                ttl_ms=300))
        await broker_stub.CancelTask(pb.CancelTaskRequest(task_id=cancelled.task_id))

        async def member_gone():
            return await r.zscore(index, cancelled.task_id) is None
        await _poll(member_gone)
        task = await broker_stub.GetTask(pb.GetTaskRequest(task_id=cancelled.task_id))
        assert task.task.status == pb.TASK_STATUS_CANCELLED

        delayed = await broker_stub.Enqueue(pb.EnqueueRequest(
            queue="idx", task_type="t", delay_ms=200, ttl_ms=600))
        assert await r.zscore(index, delayed.task_id) is None  # scheduled, not waiting

        async def expired():
            got = await broker_stub.GetTask(pb.GetTaskRequest(task_id=delayed.task_id))
            return got.task.status == pb.TASK_STATUS_EXPIRED
        await _poll(expired)
        assert not await r.exists(index)
    finally:
        await r.aclose()


async def test_an_entry_a_read_took_is_left_to_activation(gateway, broker_stub, redis_url):
    r = aioredis.from_url(redis_url)
    try:
        taken = await broker_stub.Enqueue(pb.EnqueueRequest(queue="rd", task_type="t",
                                                            ttl_ms=200))
        # the moment between a lease read and its activation, held open
        await r.xreadgroup(keys.GROUP, "w-reading", {keys.stream("rd", 5): ">"}, count=1)
        before = gateway.scheduler.mover.counts["reading"]

        async def seen_reading():
            return gateway.scheduler.mover.counts["reading"] > before
        await _poll(seen_reading)
        task = await broker_stub.GetTask(pb.GetTaskRequest(task_id=taken.task_id))
        assert task.task.status == pb.TASK_STATUS_QUEUED
        assert await r.xlen(keys.stream("rd", 5)) == 1
        assert await r.zscore(keys.expiring("rd"), taken.task_id) is not None
    finally:
        await r.aclose()
