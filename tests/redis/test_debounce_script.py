"""enqueue.lua's debounce against a real Redis: the record it keeps, and the Redis
commands of an Enqueue without debounce (debounce adds none to them)."""

from __future__ import annotations

import json

import redis.asyncio as aioredis

from dtq_gateway.domain.validation import validate_enqueue
from dtq_gateway.store import keys
from dtq_gateway.store.broker import Broker
from dtq_gateway.store.groups import Groups
from dtq_proto import dtq_pb2 as pb
from tests.conftest import gateway_settings

#: What one plain enqueue of a queue already known runs, as INFO commandstats counts
#: them (the script's own commands: the band summary's SADD, and on a standalone Redis
#: the recent-tasks index write: its ZADD; the trim comes once the process added more
#: than its slack, broker.RECENT_TRIM_SLACK, not with the second enqueue).
PLAIN_ENQUEUE = {"evalsha": 1, "time": 1, "xadd": 1, "sadd": 1, "hset": 1, "set": 1,
                 "publish": 1, "zadd": 1}


async def _commands(redis_url: str, req: pb.EnqueueRequest) -> dict[str, int]:
    r = aioredis.Redis.from_url(redis_url)
    settings = gateway_settings(redis_url)
    broker = Broker(r, settings, Groups(settings.max_queues))
    await broker.enqueue_many([validate_enqueue(req, settings)])  # warm: script, groups
    await r.config_resetstat()
    await broker.enqueue_many([validate_enqueue(req, settings)])
    stats = await r.info("commandstats")
    await r.aclose()
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()
            if not k.startswith("cmdstat_config")}


async def test_enqueue_without_debounce_runs_the_same_commands(redis_url):
    assert await _commands(redis_url, pb.EnqueueRequest(queue="q", task_type="t")) \
        == PLAIN_ENQUEUE


def test_enqueue_without_debounce_sends_the_same_arguments(redis_url):
    """3 queue keys + 3 per task (+ the recent-tasks index last, standalone Redis),
    ARGV 7 + 21 per task, ARGV[4] = 0: the layout of enqueue.lua's header before
    debounce (plus the concurrency key and the required labels, ARGV[a+20] and [a+21])."""
    settings = gateway_settings(redis_url)
    broker = Broker(aioredis.Redis.from_url(redis_url), settings, Groups())
    task = validate_enqueue(pb.EnqueueRequest(queue="q", task_type="t"), settings)
    keys_, args = broker._enqueue_call([task, task])
    assert (len(keys_), len(args), args[3]) == (3 + 2 * 3 + 1, 7 + 2 * 21, 0)
    assert keys_[-1] == keys.RECENT_TASKS


async def test_debounce_record_lives_in_the_queue_slot_with_its_ttl(redis_url):
    r = aioredis.Redis.from_url(redis_url)
    settings = gateway_settings(redis_url)
    broker = Broker(r, settings, Groups())
    outs = {}
    for mode, window in ((pb.DEBOUNCE_MODE_KEEP_FIRST, 5000), (pb.DEBOUNCE_MODE_KEEP_LAST, 2000)):
        req = pb.EnqueueRequest(queue="q", task_type="t", debounce=pb.Debounce(
            key=f"k{mode}", window_ms=window, mode=mode))
        (outs[mode],) = await broker.enqueue_many([validate_enqueue(req, settings)])
    first_key = keys.debounce("q", keys.idempotency_digest(f"k{pb.DEBOUNCE_MODE_KEEP_FIRST}"))
    last_key = keys.debounce("q", keys.idempotency_digest(f"k{pb.DEBOUNCE_MODE_KEEP_LAST}"))
    assert first_key.startswith("dtq:debounce:{q}:")
    assert keys.key_slot(first_key) == keys.key_slot(keys.schedule("q"))
    first, last = [json.loads(await r.get(k)) for k in (first_key, last_key)]
    assert (first["task_id"], first["mode"]) == (outs[pb.DEBOUNCE_MODE_KEEP_FIRST].task_id, "first")
    assert first["until_ms"] - first["first_ms"] == 5000 and 0 < await r.pttl(first_key) <= 5000
    assert last["until_ms"] - last["first_ms"] == 2000  # the task's due time
    assert 2000 + 60_000 - 1000 < await r.pttl(last_key) <= 2000 + 60_000
    await r.aclose()


async def _evalshas(r, coro) -> tuple[object, int]:
    await r.config_resetstat()
    out = await coro
    stats = await r.info("commandstats")
    return out, stats.get("cmdstat_evalsha", {}).get("calls", 0)


async def test_a_gateway_that_knows_the_burst_absorbs_in_one_call(redis_url):
    """The script touches only the task hash it is given: a gateway that has not seen
    the burst's task learns it from a debounce_retry reply (two calls), then
    remembers it (one call)."""
    r = aioredis.Redis.from_url(redis_url)
    settings = gateway_settings(redis_url)
    a, b = (Broker(r, settings, Groups()) for _ in range(2))
    req = pb.EnqueueRequest(queue="q", task_type="t", debounce=pb.Debounce(
        key="k", window_ms=60_000, mode=pb.DEBOUNCE_MODE_KEEP_LAST))
    (first,), _ = await _evalshas(r, a.enqueue_many([validate_enqueue(req, settings)]))
    (same,), calls_a = await _evalshas(r, a.enqueue_many([validate_enqueue(req, settings)]))
    (other,), calls_b = await _evalshas(r, b.enqueue_many([validate_enqueue(req, settings)]))
    (again,), calls_b2 = await _evalshas(r, b.enqueue_many([validate_enqueue(req, settings)]))
    await r.aclose()
    assert not first.debounced and same.debounced and other.debounced and again.debounced
    assert {same.task_id, other.task_id, again.task_id} == {first.task_id}
    assert (calls_a, calls_b, calls_b2) == (1, 2, 1)


async def test_debounce_with_a_depth_limit_counts_only_created_tasks(redis_url):
    """With DTQ_MAX_QUEUE_DEPTH the ten band streams follow the debounce KEY of each
    task; an absorbed enqueue adds nothing, so it is never refused as full."""
    r = aioredis.Redis.from_url(redis_url)
    settings = gateway_settings(redis_url, max_queue_depth=2)
    broker = Broker(r, settings, Groups())
    first = pb.Debounce(key="k", window_ms=60_000, mode=pb.DEBOUNCE_MODE_KEEP_FIRST)
    reqs = [pb.EnqueueRequest(queue="q", task_type="t", priority=0, debounce=first),
            pb.EnqueueRequest(queue="q", task_type="t", priority=0)]
    made = await broker.enqueue_many([validate_enqueue(q, settings) for q in reqs])
    outs = await broker.enqueue_many([validate_enqueue(q, settings) for q in reqs])
    await r.aclose()
    assert [type(o).__name__ for o in made + outs] == ["Enqueued"] * 3 + ["QueueFull"]
    assert outs[0].debounced and outs[0].task_id == made[0].task_id
