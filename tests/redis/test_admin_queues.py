"""Admin queue functions against a private redis-server: stats, listing, pause/resume."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from dtq_gateway.errors import InvalidArgument, NotFound
from dtq_gateway.events.events_wire import decode
from dtq_gateway.store import admin, admin_lists, keys
from tests.support.admin_seed import dead_letter, ensure_group, now_ms, put_task

CALL = admin.CallInfo(actor="alice", request_id="req-1")


@pytest.fixture
async def r(redis_url: str):
    client = aioredis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_list_queues_sorted_with_depth_pending_and_paused(r: aioredis.Redis) -> None:
    await put_task(r, "beta", band=1)
    await put_task(r, "alpha", band=9)
    await put_task(r, "alpha", band=0)
    await r.xreadgroup(keys.GROUP, "w1", {keys.stream("alpha", 9): ">"}, count=1)
    await r.set(keys.paused("beta"), "1")
    queues, token = await admin.list_queues(r)
    assert [(q.name, q.depth, q.pending, q.paused) for q in queues] == [
        ("alpha", 2, 1, False), ("beta", 1, 0, True)]
    assert token == ""


async def test_list_queues_pages_through_the_registry_in_name_order(r: aioredis.Redis) -> None:
    names = [f"q{i:03d}" for i in range(25)] + ["A", "Z.z", "a-b", "a_b"]
    await r.zadd(keys.QUEUES, dict.fromkeys(names, 0))
    await put_task(r, "q007", band=4)  # numbers come from the page's own streams
    seen, token, pages = [], "", 0
    while True:
        page, token = await admin.list_queues(r, 10, token)
        seen += page
        pages += 1
        if not token:
            break
        assert token == page[-1].name and len(page) == 10
    assert pages == 3 and [q.name for q in seen] == sorted(names)  # byte order
    assert [(q.depth, q.paused) for q in seen if q.name == "q007"] == [(1, False)]
    assert all(q.depth == 0 and q.pending == 0 for q in seen if q.name != "q007")
    last, token = await admin.list_queues(r, 9, "q019")  # a token past the end
    assert [q.name for q in last] == [f"q0{i}" for i in range(20, 25)] and token == ""


async def test_list_queues_exact_last_page_has_no_token(r: aioredis.Redis) -> None:
    await r.zadd(keys.QUEUES, {"a": 0, "b": 0})
    page, token = await admin.list_queues(r, 2)
    assert [q.name for q in page] == ["a", "b"] and token == ""
    assert await admin.list_queues(r, 5, "b") == ([], "")


@pytest.mark.parametrize("token", ["bad token", "x" * 65, "a:b", "(a"])
async def test_list_queues_rejects_a_malformed_token(r: aioredis.Redis, token: str) -> None:
    with pytest.raises(InvalidArgument) as exc:
        await admin.list_queues(r, 10, token)
    assert exc.value.field == "page_token"


async def test_queue_stats_bands_depth_pending_consumers(r: aioredis.Redis) -> None:
    for band in (9, 9, 3):
        await put_task(r, "q1", band=band)
    await r.xreadgroup(keys.GROUP, "w1", {keys.stream("q1", 9): ">"}, count=1)
    await r.xreadgroup(keys.GROUP, "w2", {keys.stream("q1", 9): ">"}, count=1)
    stats = await admin.queue_stats(r, "q1")
    by_band = {b.band: (b.depth, b.pending) for b in stats.bands}
    assert [b.band for b in stats.bands] == list(range(9, -1, -1))
    assert by_band[9] == (2, 2) and by_band[3] == (1, 0) and by_band[0] == (0, 0)
    assert (stats.depth, stats.pending) == (3, 2)
    assert [(c.name, c.pending) for c in stats.consumers] == [("w1", 1), ("w2", 1)]


async def test_queue_stats_oldest_age_ignores_delivered_entries(r: aioredis.Redis) -> None:
    # The delivered (leased) entry is older than the undelivered one: the age
    # must come from the first entry after last-delivered-id, not the stream head.
    await ensure_group(r, "q1", 5)
    now = await now_ms(r)
    await r.xadd(keys.stream("q1", 5), {"task_id": "a"}, id=f"{now - 60000}-0")
    await r.xadd(keys.stream("q1", 5), {"task_id": "b"}, id=f"{now - 20000}-0")
    await r.xadd(keys.stream("q1", 2), {"task_id": "c"}, id=f"{now - 5000}-0")
    await r.xreadgroup(keys.GROUP, "w1", {keys.stream("q1", 5): ">"}, count=1)
    stats = await admin.queue_stats(r, "q1")
    assert 20000 <= stats.oldest_task_age_ms < 30000


async def test_queue_stats_oldest_age_zero_when_all_delivered(r: aioredis.Redis) -> None:
    await put_task(r, "q1", band=5)
    await r.xreadgroup(keys.GROUP, "w1", {keys.stream("q1", 5): ">"}, count=10)
    assert (await admin.queue_stats(r, "q1")).oldest_task_age_ms == 0


async def test_queue_stats_scheduled_and_dead_letter_depth(r: aioredis.Redis) -> None:
    await put_task(r, "q1")
    for queue in ("q1", "q1", "other"):
        tid = await put_task(r, queue, status="scheduled", stream_entry=False)
        await r.zadd(keys.schedule(queue), {tid: 1})
    await dead_letter(r, "q1")
    await dead_letter(r, "other")
    await r.set(keys.paused("q1"), "1")
    stats = await admin.queue_stats(r, "q1")
    assert (stats.scheduled, stats.dead_letter_depth, stats.paused) == (2, 1, True)


async def test_queue_stats_unknown_queue_not_found(r: aioredis.Redis) -> None:
    with pytest.raises(NotFound) as exc:
        await admin.queue_stats(r, "nope")
    assert exc.value.reason == "QUEUE_NOT_FOUND"


@pytest.mark.parametrize("name", ["", "a:b", "x" * 65, "sp ace"])
async def test_queue_stats_invalid_name_names_field(r: aioredis.Redis, name: str) -> None:
    with pytest.raises(InvalidArgument) as exc:
        await admin.queue_stats(r, name)
    assert exc.value.field == "queue"


async def test_pause_resume_changed_flags_event_and_audit(r: aioredis.Redis) -> None:
    pubsub = r.pubsub()
    await pubsub.subscribe(keys.EVENTS_CHANNEL)
    await pubsub.get_message(timeout=1)  # subscribe confirmation
    assert await admin.set_paused(r, "q1", True, CALL, "deploy", create=True) is True
    assert await r.get(keys.paused("q1")) == b"1"
    assert await admin.set_paused(r, "q1", True, CALL) is False
    assert await admin.set_paused(r, "q1", False, CALL) is True
    assert await r.exists(keys.paused("q1")) == 0
    assert await admin.set_paused(r, "q1", False, CALL) is False
    events = []
    while (msg := await pubsub.get_message(timeout=0.5)) is not None:
        events.extend(decode(msg["data"]) or [])
    await pubsub.aclose()
    assert [(e["type"], e["queue"], e["metadata"]["paused"]) for e in events] == [
        ("CONFIGURATION_CHANGED", "q1", "true"), ("CONFIGURATION_CHANGED", "q1", "false")]
    audit, _ = await admin_lists.list_audit(r, 10)
    assert [(a.action, a.task_id, a.actor, a.request_id) for a in reversed(audit)] == [
        ("pause_queue", "q1", "alice", "req-1"), ("pause_queue", "q1", "alice", "req-1"),
        ("resume_queue", "q1", "alice", "req-1"), ("resume_queue", "q1", "alice", "req-1")]
    assert audit[-1].detail == "deploy" and audit[-2].detail == "unchanged"
    # nothing else left behind but the registry entry that create made
    assert set(await r.keys("*")) == {keys.AUDIT.encode(), keys.QUEUES.encode()}
