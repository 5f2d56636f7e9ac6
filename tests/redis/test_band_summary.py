"""The per-queue band summary dtq:queue:{<q>}:bands (_lib.lua bands_key/note_band,
_lease_read.lua live_streams): lease_take probes only the bands it names, and the
summary can only ever delay a task by its TTL, never lose one."""

from __future__ import annotations

import time

import pytest

from dtq_gateway.store import keys
from tests.redis.test_core_scripts import Env
from tests.redis.test_lease_take import take
from tests.support.seed import seed_queue


@pytest.fixture
async def env(redis_url):
    e = Env(redis_url)
    await e.groups.ensure(e.redis, ["q"])
    yield e
    await e.redis.aclose()


async def members(env: Env) -> set[bytes]:
    return set(await env.redis.smembers(keys.queue_bands("q")))


async def test_a_read_rebuilds_the_summary_with_a_ttl(env) -> None:
    await seed_queue(env.broker, env.settings, priority=7)
    await take(env)  # a read probes all ten bands (no trusted summary yet)
    assert await members(env) == {b"*", b"7"}
    assert 0 < await env.redis.pttl(keys.queue_bands("q")) <= 1000


async def test_enqueue_marks_its_band_and_the_next_read_finds_it(env) -> None:
    await take(env)
    assert await members(env) == {b"*"}  # trusted, every band empty
    (tid,) = await seed_queue(env.broker, env.settings, priority=3)
    assert await members(env) == {b"*", b"3"}
    got = await take(env)
    assert [e.task_id for e in got.entries] == [tid]


async def test_a_band_found_empty_leaves_the_summary(env) -> None:
    await take(env)
    await env.redis.sadd(keys.queue_bands("q"), "4")  # a superset costs one XLEN
    await take(env)
    assert await members(env) == {b"*"}


async def test_an_entry_written_around_the_summary_waits_at_most_its_ttl(env) -> None:
    """A writer that does not keep the summary (an older gateway in an upgrade): its
    entry is found once the trusted summary expires and a read probes every band."""
    await take(env)
    (tid,) = await seed_queue(env.broker, env.settings, priority=2)
    await env.redis.srem(keys.queue_bands("q"), "2")  # as if written without note_band
    assert (await take(env)).entries == []
    deadline = time.monotonic() + 5
    while await env.redis.exists(keys.queue_bands("q")):
        assert time.monotonic() < deadline, "the summary never expired"
        await env.redis.ping()  # poll: the key's TTL runs in Redis
    assert [e.task_id for e in (await take(env)).entries] == [tid]


async def test_a_set_without_the_trusted_member_is_probed_in_full(env) -> None:
    (tid,) = await seed_queue(env.broker, env.settings, priority=6)
    await env.redis.delete(keys.queue_bands("q"))
    await env.redis.sadd(keys.queue_bands("q"), "1")  # e.g. created by note_band alone
    assert [e.task_id for e in (await take(env)).entries] == [tid]
    assert await members(env) == {b"*", b"6"}


async def test_a_read_of_a_summarised_queue_probes_only_its_bands(env) -> None:
    """The cost the summary buys: one SMEMBERS and one XLEN per named band, not ten XLEN."""
    await seed_queue(env.broker, env.settings, priority=4)
    await take(env)  # rebuilds the summary: {*, 4}
    await env.redis.config_resetstat()
    await take(env)
    stats = await env.redis.info("commandstats")
    calls = {k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()}
    assert (calls.get("smembers"), calls.get("xlen")) == (1, 1), calls
