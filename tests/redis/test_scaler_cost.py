"""The KEDA scaler's cost per call is bounded by the queues its trigger names, not by
the number of queues in Redis: at most 40 commands per named queue plus TIME, in
three round trips (two pipelines and TIME), counted at the redis-py layer."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from dtq_gateway.rpc.keda_scaler import MAX_QUEUES, parse_trigger, read_figures
from dtq_gateway.store import keys


@pytest.fixture
def counted(monkeypatch):
    """Commands and round trips made through redis-py while the fixture is active."""
    seen = {"commands": 0, "round_trips": 0}
    plain, piped = aioredis.Redis.execute_command, Pipeline.execute

    async def one(self, *args, **kwargs):
        seen["commands"] += 1
        seen["round_trips"] += 1
        return await plain(self, *args, **kwargs)

    async def many(self, *args, **kwargs):
        seen["commands"] += len(self.command_stack)
        seen["round_trips"] += 1
        return await piped(self, *args, **kwargs)

    monkeypatch.setattr(aioredis.Redis, "execute_command", one)
    monkeypatch.setattr(Pipeline, "execute", many)
    return seen


async def _fill(r, queues: list[str]) -> None:
    """One waiting entry in every band of each queue (the most work a read can find)."""
    for q in queues:
        for band in range(10):
            stream = keys.stream(q, band)
            await r.xgroup_create(stream, keys.GROUP, id="0", mkstream=True)
            await r.xadd(stream, {"task_id": "t"})


async def _cost(r, counted, trigger) -> dict:
    counted.update(commands=0, round_trips=0)
    figures = await read_figures(r, trigger)
    assert figures.waiting == 10 * len(trigger.queues)
    return dict(counted)


async def test_cost_does_not_grow_with_the_queues_in_redis(redis_url, counted) -> None:
    r = aioredis.from_url(redis_url)
    try:
        named = [f"n{i}" for i in range(MAX_QUEUES)]
        await _fill(r, named)
        one, every = parse_trigger({"queue": "n0"}), parse_trigger({"queues": ",".join(named)})
        alone = await _cost(r, counted, one)
        most = await _cost(r, counted, every)
        await _fill(r, [f"other{i}" for i in range(200)])
        assert await _cost(r, counted, one) == alone
        assert await _cost(r, counted, every) == most
    finally:
        await r.aclose()
    assert alone == {"commands": 41, "round_trips": 3}
    assert most == {"commands": 40 * MAX_QUEUES + 1, "round_trips": 3}
