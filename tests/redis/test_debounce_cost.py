"""The Redis commands of an Enqueue without debounce: debounce adds none to them."""

from __future__ import annotations

import redis.asyncio as aioredis

from dtq_gateway.store.broker import Broker
from dtq_gateway.store.groups import Groups
from dtq_gateway.validation import validate_enqueue
from dtq_proto import dtq_pb2 as pb
from tests.conftest import gateway_settings

#: What one plain enqueue of a queue already known runs, as INFO commandstats counts
#: them (the script's own commands, then the recent-tasks index write).
PLAIN_ENQUEUE = {"evalsha": 1, "time": 1, "xadd": 1, "hset": 1, "set": 1, "publish": 1,
                 "zadd": 1, "zremrangebyrank": 1}


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
    """3 queue keys + 3 per task, ARGV 7 + 19 per task, ARGV[4] = 0: the layout of
    enqueue.lua's header before debounce."""
    settings = gateway_settings(redis_url)
    broker = Broker(aioredis.Redis.from_url(redis_url), settings, Groups())
    task = validate_enqueue(pb.EnqueueRequest(queue="q", task_type="t"), settings)
    keys_, args = broker._enqueue_call([task, task])
    assert (len(keys_), len(args), args[3]) == (3 + 2 * 3, 7 + 2 * 19, 0)
