"""dtq_queue_stuck_tasks: waiting tasks of a type no live worker of the queue takes,
read by the metrics refresh once the queue's backlog is old, on a real Redis (Lua)."""

from __future__ import annotations

import json

import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from dtq_gateway.duties.queue_gauges import QueueGaugeCollector
from dtq_gateway.store import admin, admin_waiting, keys


async def test_stuck_tasks_gauge_counts_types_no_live_worker_takes(redis_url) -> None:
    r = aioredis.from_url(redis_url)
    try:
        stream = keys.stream("sq", 5)
        await r.xgroup_create(stream, keys.GROUP, id="0", mkstream=True)
        sec, _ = await r.time()
        old = (sec - 60) * 1000
        await r.xadd(stream, {"task_id": "a", "task_type": "orphan"}, id=f"{old}-0")
        await r.xadd(stream, {"task_id": "b", "task_type": "orphan", "queued_at": old})
        await r.xadd(stream, {"task_id": "c", "task_type": "known"})
        await r.hset(keys.worker("w1"), mapping={
            "last_heartbeat": sec * 1000, "status": "alive", "queues": "sq",
            "task_types": "known", "labels": json.dumps({})})
        await r.sadd(keys.WORKERS, "w1")
        await r.sadd(keys.BUSY_QUEUES, "sq")
        await QueueGaugeCollector(r, heartbeat_interval_ms=10_000).tick()
        assert REGISTRY.get_sample_value("dtq_queue_stuck_tasks", {"queue": "sq"}) == 2
        age = REGISTRY.get_sample_value("dtq_queue_backlog_age_seconds", {"queue": "sq"})
        assert 59 <= age < 70
    finally:
        await r.aclose()


async def test_waiting_scan_is_bounded_and_says_so(redis_url) -> None:
    r = aioredis.from_url(redis_url)
    try:
        for band, n in ((9, 2), (3, 3)):
            stream = keys.stream("big", band)
            await r.xgroup_create(stream, keys.GROUP, id="0", mkstream=True)
            for i in range(n):
                await r.xadd(stream, {"task_id": f"{band}-{i}", "task_type": f"t{band}"})
        now = await admin.redis_now_ms(r)
        waiting, complete = await admin_waiting.waiting_by_type(r, "big", now, 10_000, scan_max=3)
        assert not complete
        assert [(t.task_type, t.waiting) for t in waiting] == [("t9", 2), ("t3", 1)]
        waiting, complete = await admin_waiting.waiting_by_type(r, "big", now, 10_000, scan_max=5)
        assert complete and sum(t.waiting for t in waiting) == 5
    finally:
        await r.aclose()


async def test_stuck_tasks_gauge_counts_labels_no_live_worker_has(redis_url) -> None:
    """Tasks whose required labels no live worker of the queue has are stuck too; the
    same type without labels (or with labels a worker has) is not."""
    r = aioredis.from_url(redis_url)
    try:
        stream = keys.stream("lq", 5)
        await r.xgroup_create(stream, keys.GROUP, id="0", mkstream=True)
        sec, _ = await r.time()
        old = (sec - 60) * 1000
        await r.xadd(stream, {"task_id": "a", "task_type": "t", "req_labels": '{"gpu":"a100"}'},
                     id=f"{old}-0")
        await r.xadd(stream, {"task_id": "b", "task_type": "t", "req_labels": '{"zone":"eu"}'})
        await r.xadd(stream, {"task_id": "c", "task_type": "t"})
        await r.hset(keys.worker("w1"), mapping={
            "last_heartbeat": sec * 1000, "status": "alive", "queues": "lq",
            "task_types": "", "labels": json.dumps({"zone": "eu"})})
        await r.sadd(keys.WORKERS, "w1")
        await r.sadd(keys.BUSY_QUEUES, "lq")
        await QueueGaugeCollector(r, heartbeat_interval_ms=10_000).tick()
        assert REGISTRY.get_sample_value("dtq_queue_stuck_tasks", {"queue": "lq"}) == 1
        stats = await admin.queue_stats(r, "lq", 10_000)
        assert stats.stuck_task_types == ["t"]
        assert {(json.dumps(t.required_labels), t.taken) for t in stats.waiting_types} == {
            ('{"gpu": "a100"}', False), ('{"zone": "eu"}', True), ("{}", True)}
    finally:
        await r.aclose()
