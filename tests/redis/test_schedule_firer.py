"""The schedule firer against real Redis: it keeps up with what falls due, and counts
late and missed fires.

The firer is driven tick by tick (no gateway, no timer), with a lock that always
leads, so each test decides exactly when a tick runs.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from dtq_gateway.duties.schedule_firer import ScheduleFirer
from dtq_gateway.store import keys, schedules
from dtq_gateway.store.broker import Broker
from dtq_gateway.store.groups import Groups
from dtq_proto import dtq_pb2 as pb
from tests.conftest import gateway_settings
from tests.redis.sched_support import redis_ms
from tests.support.leasing import poll


@pytest.fixture
async def env(redis_url):
    redis = Redis.from_url(redis_url)
    settings = gateway_settings(redis_url)
    firer = ScheduleFirer(redis, settings, SimpleNamespace(is_leader=True),
                          Broker(redis, settings, Groups()))
    yield SimpleNamespace(redis=redis, settings=settings, firer=firer)
    await redis.aclose()


def every_second(name: str) -> pb.Schedule:
    return pb.Schedule(name=name, interval_ms=1000, task=pb.EnqueueRequest(
        queue="sched", task_type="tick", payload=b"{}"))


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_one_tick_fires_every_due_schedule(env) -> None:
    """1,200 schedules due at once all fire in one tick (the firer used to take 100 per
    tick, so most one-second schedules fell behind and lost fires)."""
    n = 1200
    for i in range(n):
        await schedules.create(env.redis, env.settings, every_second(f"s{i:04d}"), False)
    last_due = int((await env.redis.zrange(keys.SCHEDULES, -1, -1, withscores=True))[0][1])
    await poll(lambda: redis_ms(env.redis), lambda now: now >= last_due, timeout_s=10)
    before = sample("dtq_schedule_fires_total")
    now = await redis_ms(env.redis)
    await env.firer.tick()
    # every schedule due before the tick moved on to a fire after it
    assert not await env.redis.zrangebyscore(keys.SCHEDULES, "-inf", now)
    assert sample("dtq_schedule_fires_total") - before >= n
    infos = [schedules.info_of(f) for f in await schedules.load_many(
        env.redis, [f"s{i:04d}" for i in range(n)])]
    assert min(i.fires_total for i in infos) >= 1
    assert sum([await env.redis.xlen(s) for s in keys.queue_streams_desc("sched")]) >= n


async def test_late_and_missed_fires_are_counted(env) -> None:
    """A one-second schedule whose last handled fire is 60 s old (a leader stalled for a
    minute): the fires of the last 30 s are enqueued late and counted late, the older
    ones are dropped by the SKIP policy and counted missed."""
    await schedules.create(env.redis, env.settings, every_second("stalled"), False)
    now = await redis_ms(env.redis)
    now -= now % 1000
    key = keys.periodic_schedule("stalled")
    await env.redis.hset(key, mapping={"anchor_ms": now - 120_000, "done_ms": now - 60_000})
    await env.redis.zadd(keys.SCHEDULES, {"stalled": now - 59_000})
    late, missed = sample("dtq_schedule_fires_late_total"), sample(
        "dtq_schedule_fires_missed_total", policy="skip")
    fired = sample("dtq_schedule_fires_total")
    await env.firer.tick()
    # the tick's own clock decides what is older than 30 s: on a busy machine each
    # second between `now` and the tick moves one fire from late to missed
    slack = (await redis_ms(env.redis) - now) // 1000
    enqueued = sample("dtq_schedule_fires_total") - fired
    assert 29 <= sample("dtq_schedule_fires_missed_total", policy="skip") - missed <= 30 + slack
    assert 29 - slack <= enqueued <= 32
    assert enqueued - 3 <= sample("dtq_schedule_fires_late_total") - late <= enqueued
    info = schedules.info_of(await env.redis.hgetall(key))
    assert info.fires_total == enqueued and info.next_fire_ms > now
    missed_first = sample("dtq_schedule_fires_missed_total", policy="skip")

    def due(at_ms: int) -> int:  # fires of the 1 s grid from next_fire_ms up to at_ms
        return 0 if at_ms < info.next_fire_ms else (at_ms - info.next_fire_ms) // 1000 + 1

    before = await redis_ms(env.redis)
    await env.firer.tick()  # nothing counted twice: only the seconds that came due since
    after = await redis_ms(env.redis)
    assert due(before) <= sample("dtq_schedule_fires_total") - fired - enqueued <= due(after)
    assert sample("dtq_schedule_fires_missed_total", policy="skip") == missed_first
