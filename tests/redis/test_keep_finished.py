"""DTQ_KEEP_FINISHED: retention by count of finished task records, per queue.

The acks themselves add their tasks to the queue's finished index and delete the
oldest records beyond N (lua/_finished.lua), so memory is bounded by count without a
scan.
"""

from __future__ import annotations

import pytest

from dtq_gateway.store import keys
from dtq_proto import dtq_pb2 as pb
from tests.redis.test_core_scripts import Env


async def _run(env: Env, n: int, batch: int = 500, queue: str = "q") -> list[str]:
    """Enqueue, lease and ack ``n`` tasks of ``queue`` in batches; returns their ids."""
    from dtq_gateway.domain.validation import validate_enqueue

    ids: list[str] = []
    for start in range(0, n, batch):
        size = min(batch, n - start)
        reqs = [validate_enqueue(pb.EnqueueRequest(queue=queue, task_type="t",
                                                   payload=b"1" * 100), env.settings)
                for _ in range(size)]
        ids += [out.task_id for out in await env.broker.enqueue_many(reqs)]
        leased: list = []
        while len(leased) < size:
            got = await env.lease(queues=(queue,), max_in_flight=size)
            assert got, "the enqueued tasks must be leasable"
            leased += got
        outcomes = await env.completion.ack(
            [pb.AckItem(lease_id=t.lease_id, result=b"r" * 50) for t in leased])
        assert {o.status for o in outcomes} == {"succeeded"}
    return ids


async def test_acks_keep_only_the_newest_n_finished_records_per_queue(redis_url):
    env = Env(redis_url, keep_finished=5)
    try:
        ids = await _run(env, 12, batch=4)
        other = await _run(env, 3, batch=3, queue="other")
        kept = [t for t in ids if await env.redis.exists(keys.task(t))]
        assert kept == ids[-5:], "the oldest records beyond N are deleted, the newest kept"
        assert not any([await env.redis.exists(keys.result(t)) for t in ids[:-5]])
        assert all([await env.redis.exists(keys.result(t)) for t in ids[-5:]])
        assert await env.redis.zcard(keys.finished("q")) == 5
        # the count is per queue: the other queue's three records stay
        assert all([await env.redis.exists(keys.task(t)) for t in other])
    finally:
        await env.redis.aclose()


async def test_without_keep_finished_every_record_stays_until_its_ttl(redis_url):
    env = Env(redis_url)
    try:
        ids = await _run(env, 12, batch=4)
        assert all([await env.redis.exists(keys.task(t)) for t in ids])
        assert not await env.redis.exists(keys.finished("q"))
    finally:
        await env.redis.aclose()


@pytest.mark.slow
async def test_memory_stays_flat_over_100000_tasks(redis_url):
    """100,000 tasks through enqueue, lease and ack with DTQ_KEEP_FINISHED=1000: the
    keys and used memory after 100,000 are those after 20,000 (the index holds N)."""
    env = Env(redis_url, keep_finished=1000)
    try:
        await _run(env, 20_000)
        keys_at_20k = await env.redis.dbsize()
        mem_at_20k = (await env.redis.info("memory"))["used_memory"]
        await _run(env, 80_000)
        keys_at_100k = await env.redis.dbsize()
        mem_at_100k = (await env.redis.info("memory"))["used_memory"]
        assert keys_at_100k == keys_at_20k, (keys_at_20k, keys_at_100k)
        # flat: within 10 % (allocator noise), where 80,000 more kept records (about
        # 1 KB each) would have added tens of MB
        assert mem_at_100k < mem_at_20k * 1.1, (mem_at_20k, mem_at_100k)
        assert await env.redis.zcard(keys.finished("q")) == 1000
        # the index itself: under 200 bytes per kept task (docs/operations.md)
        assert await env.redis.memory_usage(keys.finished("q")) < 200 * 1000
    finally:
        await env.redis.aclose()


async def test_cancels_count_towards_the_kept_finished_records(redis_url):
    env = Env(redis_url, keep_finished=2)
    try:
        ids = [await env.enqueue() for _ in range(3)]
        for tid in ids:
            assert await env.broker.cancel(tid, "op", "r1", "") == "cancelled"
        assert [bool(await env.redis.exists(keys.task(t))) for t in ids] == [
            False, True, True]
        assert await env.redis.zcard(keys.finished("q")) == 2
    finally:
        await env.redis.aclose()


async def test_one_call_trims_at_most_its_own_count_plus_64(redis_url):
    """A backlog beyond N (N lowered) drains over several calls, each bounded."""
    env = Env(redis_url, keep_finished=200)
    try:
        await _run(env, 150, batch=150)
        lowered = Env(redis_url, keep_finished=1)
        try:
            await _run(lowered, 1, batch=1)
            assert await env.redis.zcard(keys.finished("q")) == 151 - (1 + 64)
            await _run(lowered, 1, batch=1)
            assert await env.redis.zcard(keys.finished("q")) == 87 - 65
            await _run(lowered, 1, batch=1)
            assert await env.redis.zcard(keys.finished("q")) == 1
        finally:
            await lowered.redis.aclose()
    finally:
        await env.redis.aclose()


async def test_dead_lettered_tasks_are_not_counted(redis_url):
    env = Env(redis_url, keep_finished=1)
    try:
        tid = await env.enqueue(max_attempts=1)
        (task,) = await env.lease()
        await env.completion.fail([pb.FailItem(lease_id=task.lease_id,
                                             error_message="x")])
        assert await env.status(tid) == "dead_lettered"
        await _run(env, 3, batch=3)
        assert await env.redis.exists(keys.task(tid)), "a dead-lettered record keeps its TTL"
        assert await env.redis.zscore(keys.finished("q"), tid) is None
    finally:
        await env.redis.aclose()


async def test_per_queue_counts_override_the_default(redis_url):
    env = Env(redis_url, keep_finished=2, keep_finished_queues="big=4, off=0")
    try:
        default = await _run(env, 6, batch=2)
        big = await _run(env, 6, batch=2, queue="big")
        off = await _run(env, 6, batch=2, queue="off")
        assert [bool(await env.redis.exists(keys.task(t))) for t in default] == [
            False] * 4 + [True] * 2
        assert [bool(await env.redis.exists(keys.task(t))) for t in big] == [
            False] * 2 + [True] * 4
        assert all([await env.redis.exists(keys.task(t)) for t in off])
        assert not await env.redis.exists(keys.finished("off"))
    finally:
        await env.redis.aclose()


@pytest.mark.parametrize("text", ["big", "big=-1", "big=x", "a:b=3", "=3"])
def test_a_malformed_per_queue_count_is_refused_at_startup(redis_url, text):
    from dtq_gateway.settings import SettingsError

    with pytest.raises(SettingsError, match="DTQ_KEEP_FINISHED_QUEUES"):
        Env(redis_url, keep_finished_queues=text)


async def test_delete_queue_deletes_the_finished_index(redis_url):
    from dtq_gateway.store import queue_delete
    from dtq_gateway.store.admin import CallInfo

    env = Env(redis_url, keep_finished=5)
    try:
        await _run(env, 3, batch=3)
        assert await env.redis.exists(keys.finished("q"))
        done = await queue_delete.delete_queue(env.redis, "q", CallInfo("op", "r1"))
        assert keys.finished("q") in done.keys
        assert not await env.redis.exists(keys.finished("q"))
    finally:
        await env.redis.aclose()
