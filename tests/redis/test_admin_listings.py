"""Admin listings against a private redis-server: workers, recent tasks, audit."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from dtq_gateway.errors import InvalidArgument
from dtq_gateway.store import admin, admin_lists, keys
from dtq_gateway.store.audit import append_audit
from tests.support.admin_seed import now_ms, put_task, put_worker


@pytest.fixture
async def r(redis_url: str):
    client = aioredis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_list_workers_age_liveness_status(r: aioredis.Redis) -> None:
    now = await now_ms(r)
    await put_worker(r, "w-alive", last_heartbeat_ms=now - 1000)
    await put_worker(r, "w-stale", last_heartbeat_ms=now - 40_000)
    await put_worker(r, "w-stopped", last_heartbeat_ms=now - 500, status="stopped")
    await r.sadd(keys.WORKERS, "w-gone")  # record expired: not listed
    workers = await admin_lists.list_workers(r, heartbeat_interval_ms=10_000)
    got = [(w.worker_id, w.status, w.alive) for w in workers]
    assert got == [("w-alive", "alive", True), ("w-stale", "stale", False),
                   ("w-stopped", "stopped", False)]
    alive = workers[0]
    assert 1000 <= alive.heartbeat_age_ms < 5000
    assert (alive.active_tasks, alive.concurrency, alive.tasks_processed, alive.hostname) == (
        2, 4, 10, "h1")


async def test_list_recent_tasks_newest_first_filters_no_payload(r: aioredis.Redis) -> None:
    base = await now_ms(r)
    a = await put_task(r, "q1", created_at_ms=base)
    b = await put_task(r, "q2", created_at_ms=base + 1)
    c = await put_task(r, "q1", status="succeeded", created_at_ms=base + 2)
    tasks = await admin_lists.list_recent_tasks(r, 10)
    assert [admin.text(t["task_id"]) for t in tasks] == [c, b, a]
    assert all("payload" not in t for t in tasks)
    q1 = await admin_lists.list_recent_tasks(r, 10, queue="q1")
    assert [admin.text(t["task_id"]) for t in q1] == [c, a]
    done = await admin_lists.list_recent_tasks(r, 10, status="succeeded")
    assert [admin.text(t["task_id"]) for t in done] == [c]
    assert len(await admin_lists.list_recent_tasks(r, 2)) == 2


async def test_list_recent_tasks_skips_expired_records(r: aioredis.Redis) -> None:
    a = await put_task(r, "q1")
    await r.zadd(keys.RECENT_TASKS, {"f" * 32: 1})
    assert [admin.text(t["task_id"]) for t in await admin_lists.list_recent_tasks(r, 10)] == [a]


async def test_audit_append_and_pages(r: aioredis.Redis) -> None:
    for i in range(5):
        rec = await append_audit(r, "bob", "cancel_task", f"t{i}", f"req{i}", "why")
        assert rec.ts_ms > 0
    page1, token = await admin_lists.list_audit(r, 2)
    page2, token2 = await admin_lists.list_audit(r, 2, token)
    page3, token3 = await admin_lists.list_audit(r, 2, token2)
    assert [a.task_id for a in page1 + page2 + page3] == ["t4", "t3", "t2", "t1", "t0"]
    assert token3 == ""
    assert (page1[0].actor, page1[0].request_id, page1[0].detail) == ("bob", "req4", "why")
    with pytest.raises(InvalidArgument) as exc:
        await admin_lists.list_audit(r, 2, "nope")
    assert exc.value.field == "page_token"


async def test_audit_stream_is_bounded(r: aioredis.Redis) -> None:
    for i in range(400):
        await append_audit(r, "bob", "cancel_task", f"t{i}", "r", maxlen=100)
    # MAXLEN ~ trims whole macro nodes: bounded near, not exactly at, the limit.
    assert await r.xlen(keys.AUDIT) < 250
