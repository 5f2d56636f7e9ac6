"""On a standalone Redis enqueue.lua writes the recent-tasks index itself (its last KEY),
so a unary Enqueue is one round trip: the index write after the call has nothing left
to do but the busy set. It trims the index back to DTQ_RECENT_MAX once the gateway
process has added more than its slack since the last trim, not on every call."""

from __future__ import annotations

from dtq_gateway.domain.validation import validate_enqueue
from dtq_gateway.store import broker as broker_mod
from dtq_gateway.store import keys
from dtq_gateway.store.broker import RECENT_TRIM_SLACK
from dtq_proto import dtq_pb2 as pb
from tests.redis.test_core_scripts import Env


async def test_the_enqueue_call_indexes_its_tasks_by_creation_time(redis_url, monkeypatch):
    e = Env(redis_url, recent_max=3)
    after: list[list] = []

    async def recorded(client, recent, busy, recent_max):
        after.append(list(recent))

    monkeypatch.setattr(broker_mod, "write_indexes", recorded)
    ids = [await e.enqueue() for _ in range(5)]
    assert after == [[]] * 5, "the caller was left index entries to write"
    scored = await e.redis.zrange(keys.RECENT_TASKS, 0, -1, withscores=True)
    # trimmed to recent_max (tasks of one ms tie on score: which of them stays is ZSET order)
    assert len(scored) == 3 and {m.decode() for m, _ in scored} <= set(ids)
    for member, score in scored:
        created = await e.redis.hget(keys.task(member.decode()), "created_at_ms")
        assert int(score) == int(created)
    await e.redis.aclose()


async def test_a_batch_call_indexes_every_task(redis_url):
    e = Env(redis_url)
    reqs = [validate_enqueue(pb.EnqueueRequest(queue="q", task_type="t"), e.settings)
            for _ in range(3)]
    outs = await e.broker.enqueue_many(reqs)  # one enqueue.lua call of three tasks
    indexed = {m.decode() for m in await e.redis.zrange(keys.RECENT_TASKS, 0, -1)}
    assert indexed == {o.task_id for o in outs}
    await e.redis.aclose()


async def test_the_index_is_trimmed_once_a_process_added_more_than_its_slack(redis_url):
    """DTQ_RECENT_MAX 3,200: the slack is 31 (1 % of it, at most RECENT_TRIM_SLACK).
    Unary enqueues leave the index at most 31 over its size; the 32nd trims it back."""
    e = Env(redis_url, recent_max=3200)
    slack = RECENT_TRIM_SLACK
    assert e.broker._trim_slack == slack == 31
    reqs = [validate_enqueue(pb.EnqueueRequest(queue="q", task_type="t"), e.settings)
            for _ in range(3200 + 10)]
    await e.broker.enqueue_many(reqs)  # calls of 100 tasks: each one trims
    assert await e.redis.zcard(keys.RECENT_TASKS) == 3200
    for _ in range(slack):
        await e.enqueue()
    assert await e.redis.zcard(keys.RECENT_TASKS) == 3200 + slack
    newest = await e.enqueue()
    assert await e.redis.zcard(keys.RECENT_TASKS) == 3200
    assert await e.redis.zscore(keys.RECENT_TASKS, newest) is not None
    await e.redis.aclose()
    # 1 % of DTQ_RECENT_MAX when that is less: a small index is trimmed by every call
    assert [Env(redis_url, recent_max=n).broker._trim_slack for n in (1000, 99)] == [10, 0]
