"""On a standalone Redis enqueue.lua writes the recent-tasks index itself (its last KEY),
so a unary Enqueue is one round trip: the index write after the call has nothing left
to do but the busy set."""

from __future__ import annotations

from dtq_gateway.domain.validation import validate_enqueue
from dtq_gateway.store import broker as broker_mod
from dtq_gateway.store import keys
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
