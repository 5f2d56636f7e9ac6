"""GetQueueStats' store call reads a queue in at most two round trips to Redis, counted
on the client (every command sent on its own and every pipeline executed), not with
MONITOR."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis.asyncio as aioredis

from dtq_gateway.store import admin, keys
from tests.support.admin_seed import now_ms, put_task


class RoundTrips:
    """Counts the round trips of a redis-py asyncio client: each command it sends on
    its own (``execute_command``: EVALSHA of a script too) and each pipeline it
    executes (commands queued on a pipeline travel with its execute)."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.sent: list[str] = []
        send, make_pipeline = client.execute_command, client.pipeline

        async def execute_command(*args: Any, **kwargs: Any) -> Any:
            self.sent.append(str(args[0]))
            return await send(*args, **kwargs)

        def pipeline(*args: Any, **kwargs: Any) -> Any:
            pipe = make_pipeline(*args, **kwargs)
            run = pipe.execute

            async def execute(*a: Any, **kw: Any) -> Any:
                self.sent.append(f"pipeline of {len(pipe)}")
                return await run(*a, **kw)

            pipe.execute = execute
            return pipe

        client.execute_command = execute_command
        client.pipeline = pipeline

    def reset(self) -> None:
        self.sent.clear()


@pytest.fixture
async def r(redis_url: str):
    client = aioredis.from_url(redis_url)
    yield client
    await client.aclose()


async def _stats(r: aioredis.Redis, counter: RoundTrips, queue: str) -> admin.QueueStats:
    await admin.queue_stats(r, queue)  # loads the scripts (a first EVALSHA is NOSCRIPT)
    counter.reset()
    return await admin.queue_stats(r, queue)


async def test_a_queue_with_waiting_tasks_and_workers_takes_two_round_trips(r) -> None:
    for band in (9, 9, 3):
        await put_task(r, "q1", band=band, task_type="known" if band == 9 else "orphan")
    await r.xreadgroup(keys.GROUP, "w1", {keys.stream("q1", 9): ">"}, count=1)
    await r.set(keys.paused("q1"), "1")
    await r.hset(keys.queue_counters("q1"), mapping={"succeeded": 4, "retried": 1})
    await r.hset(keys.worker("w1"), mapping={
        "last_heartbeat": await now_ms(r), "status": "alive", "queues": "q1",
        "task_types": "known", "labels": json.dumps({})})
    await r.sadd(keys.WORKERS, "w1")
    counter = RoundTrips(r)
    stats = await _stats(r, counter, "q1")
    assert len(counter.sent) == 2, counter.sent
    assert (stats.depth, stats.pending, stats.paused) == (3, 1, True)
    assert stats.counters["succeeded"] == 4 and stats.failed == 1
    assert [c.name for c in stats.consumers] == ["w1"]
    assert stats.stuck_task_types == ["orphan"]  # w1 takes "known" only
    assert stats.oldest_task_age_ms >= 0 and stats.waiting_complete


async def test_an_empty_known_queue_takes_one_round_trip(r) -> None:
    await r.zadd(keys.QUEUES, {"idle": 0})
    counter = RoundTrips(r)
    stats = await _stats(r, counter, "idle")
    assert len(counter.sent) == 1, counter.sent
    assert (stats.depth, stats.scheduled, stats.waiting_types) == (0, 0, [])
