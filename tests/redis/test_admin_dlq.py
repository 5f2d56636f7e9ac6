"""Dead-letter administration against a private redis-server."""

from __future__ import annotations

import json

import pytest
import redis.asyncio as aioredis

from dtq_gateway.errors import InvalidArgument, NotFound, WrongState
from dtq_gateway.events.events_wire import decode
from dtq_gateway.store import admin, admin_dlq, admin_lists, keys
from tests.support.admin_seed import dead_letter, now_ms, put_task

CALL = admin.CallInfo(actor="ops", request_id="r-42")
CFG = admin_dlq.DlqSettings(audit_maxlen=10000, task_retention_s=3600)


async def dlq_total(r: aioredis.Redis) -> int:
    """Dead-letter entries of the queues these tests use."""
    return sum([await r.xlen(keys.dead_letter(q)) for q in ("q1", "q2")])


@pytest.fixture
async def r(redis_url: str):
    client = aioredis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_list_dead_letters_newest_first_paged(r: aioredis.Redis) -> None:
    ids = [await dead_letter(r, "q1") for _ in range(5)]
    page1, token = await admin_dlq.list_dead_letters(r, 2)
    page2, token2 = await admin_dlq.list_dead_letters(r, 2, token)
    page3, token3 = await admin_dlq.list_dead_letters(r, 2, token2)
    got = [admin.text(e.fields["task_id"]) for e in page1 + page2 + page3]
    assert got == list(reversed(ids))
    assert token and token2 and token3 == ""
    assert page1[0].fields["last_error_class"] == b"ValueError"


async def test_list_dead_letters_queue_filter_pages(r: aioredis.Redis) -> None:
    mine = []
    for i in range(6):
        tid = await dead_letter(r, "q1" if i % 2 else "q2")
        if i % 2:
            mine.append(tid)
    page1, token = await admin_dlq.list_dead_letters(r, 2, queue="q1")
    page2, token2 = await admin_dlq.list_dead_letters(r, 2, token, queue="q1")
    got = [admin.text(e.fields["task_id"]) for e in page1 + page2]
    assert got == list(reversed(mine))
    assert (len(page1), len(page2), token2) == (2, 1, "")


async def test_list_dead_letters_bad_token_names_field(r: aioredis.Redis) -> None:
    with pytest.raises(InvalidArgument) as exc:
        await admin_dlq.list_dead_letters(r, 10, "garbage")
    assert exc.value.field == "page_token"


async def test_requeue_fresh_budget_entry_event_audit_idempotency(r: aioredis.Redis) -> None:
    tid = await dead_letter(r, "q1", band=7, idem_key="order-1")
    pubsub = r.pubsub()
    await pubsub.subscribe(keys.EVENTS_CHANNEL)
    await pubsub.get_message(timeout=1)
    assert not await r.exists(keys.BUSY_QUEUES)
    await admin_dlq.requeue(r, tid, CALL, CFG)
    assert await r.smembers(keys.BUSY_QUEUES) == {b"q1"}  # the reaper watches it again
    assert await r.exists(keys.busy_marker("q1"))
    h = await r.hgetall(keys.task(tid))
    assert (h[b"status"], h[b"attempt"], h[b"dlq_entry_id"], h[b"requeues"]) == (
        b"queued", b"1", b"", b"1")
    assert not any(k.startswith(b"att:") for k in h)
    assert [a["attempt"] for a in json.loads(h[b"prev_attempts"])] == [1, 2, 3]
    assert await r.xlen(keys.dead_letter("q1")) == 0
    entries = await r.xrange(keys.stream("q1", 7))
    assert [(e[1][b"task_id"].decode(), e[1][b"attempt"]) for e in entries] == [(tid, b"1")]
    assert h[b"entry_id"] == entries[0][0]
    assert await r.ttl(keys.task(tid)) == -1, "a live (requeued) record has no TTL"
    idem = json.loads(await r.get(keys.idempotency("q1", keys.idempotency_digest("order-1"))))
    assert (idem["task_id"], idem["state"]) == (tid, "processing")
    msg = await pubsub.get_message(timeout=1)
    await pubsub.aclose()
    (event,) = decode(msg["data"]) or []
    assert (event["type"], event["task_id"], event["attempt"]) == ("TASK_QUEUED", tid, 1)
    audit, _ = await admin_lists.list_audit(r, 5)
    assert [(a.action, a.task_id, a.actor, a.request_id) for a in audit] == [
        ("requeue_dead_letter", tid, "ops", "r-42")]


async def test_requeue_errors(r: aioredis.Redis) -> None:
    queued = await put_task(r, "q1")
    cases = [("0" * 32, NotFound, "TASK_NOT_FOUND"), (queued, WrongState, "WRONG_STATE")]
    for task_id, exc_type, reason in cases:
        with pytest.raises(exc_type) as exc:
            await admin_dlq.requeue(r, task_id, CALL, CFG)
        assert exc.value.reason == reason
    with pytest.raises(InvalidArgument) as bad:
        await admin_dlq.requeue(r, "not-an-id", CALL, CFG)
    assert bad.value.field == "task_id"
    assert await r.xlen(keys.AUDIT) == 0  # refused calls change nothing


async def test_requeue_after_purge_is_not_found_and_changes_nothing(r: aioredis.Redis) -> None:
    tid = await dead_letter(r, "q1")
    assert await admin_dlq.purge(r, CALL, CFG) == 1
    with pytest.raises(NotFound) as exc:
        await admin_dlq.requeue(r, tid, CALL, CFG)
    assert exc.value.reason == "DEAD_LETTER_NOT_FOUND"
    assert await r.hget(keys.task(tid), "status") == b"dead_lettered"
    assert await r.exists(keys.stream("q1", 5)) == 0


async def test_discard_keeps_dead_lettered_and_marks_discarded(r: aioredis.Redis) -> None:
    tid = await dead_letter(r, "q1")
    other = await dead_letter(r, "q1")
    await admin_dlq.discard(r, tid, CALL, CFG)
    h = await r.hgetall(keys.task(tid))
    assert (h[b"status"], h[b"discarded"]) == (b"dead_lettered", b"1")
    remaining = await r.xrange(keys.dead_letter("q1"))
    assert [e[1][b"task_id"].decode() for e in remaining] == [other]
    with pytest.raises(NotFound):
        await admin_dlq.discard(r, tid, CALL, CFG)
    with pytest.raises(NotFound):
        await admin_dlq.requeue(r, tid, CALL, CFG)
    audit, _ = await admin_lists.list_audit(r, 5)
    assert [(a.action, a.task_id) for a in audit] == [("discard_dead_letter", tid)]


async def test_purge_exact_trim_to_zero_with_audit(r: aioredis.Redis) -> None:
    ids = [await dead_letter(r, "q1") for _ in range(250)]
    assert await admin_dlq.purge(r, CALL, CFG) == 250
    assert await r.xlen(keys.dead_letter("q1")) == 0
    assert await r.hget(keys.task(ids[0]), "status") == b"dead_lettered"
    audit, _ = await admin_lists.list_audit(r, 5)
    assert [(a.action, a.detail) for a in audit] == [("purge_dead_letters", "purged=250")]


async def test_redrive_filters_dry_run_and_audit(r: aioredis.Redis) -> None:
    now = await now_ms(r)
    old_match = await dead_letter(r, "q1", task_type="a", error_class="Timeout",
                                  failed_at_ms=now - 3_600_000)
    await dead_letter(r, "q1", task_type="a", error_class="Timeout")  # too young
    await dead_letter(r, "q1", task_type="b", error_class="Timeout", failed_at_ms=now - 3_600_000)
    await dead_letter(r, "q2", task_type="a", error_class="Timeout", failed_at_ms=now - 3_600_000)
    await dead_letter(r, "q1", task_type="a", error_class="KeyError",
                      failed_at_ms=now - 3_600_000)
    flt = admin_dlq.RedriveFilter(queue="q1", task_type="a", error_class="Timeout",
                                  min_age_ms=600_000)
    dry = await admin_dlq.redrive(r, flt, CALL, CFG, dry_run=True, max_per_second=100, limit=10)
    assert (dry.matched, dry.requeued, dry.task_ids) == (1, 0, [old_match])
    assert await dlq_total(r) == 5
    done = await admin_dlq.redrive(r, flt, CALL, CFG, dry_run=False, max_per_second=100,
                                   limit=10)
    assert (done.matched, done.requeued) == (1, 1)
    assert await r.hget(keys.task(old_match), "status") == b"queued"
    assert await dlq_total(r) == 4
    audit, _ = await admin_lists.list_audit(r, 10)
    actions = [(a.action, a.task_id) for a in reversed(audit)]
    assert actions == [("redrive_dead_letters", ""), ("requeue_dead_letter", old_match),
                       ("redrive_dead_letters", "")]
    assert json.loads(audit[0].detail)["requeued"] == 1


async def test_redrive_limit_and_max_age(r: aioredis.Redis) -> None:
    now = await now_ms(r)
    young = [await dead_letter(r, "q1", failed_at_ms=now - 1000) for _ in range(3)]
    await dead_letter(r, "q1", failed_at_ms=now - 10_000_000)
    flt = admin_dlq.RedriveFilter(max_age_ms=60_000)
    res = await admin_dlq.redrive(r, flt, CALL, CFG, dry_run=False, max_per_second=1000,
                                  limit=2)
    assert (res.matched, res.requeued, res.task_ids) == (2, 2, young[:2])


async def test_requeued_entry_is_delivered_to_the_existing_group(r: aioredis.Redis) -> None:
    await put_task(r, "q1", band=5)  # creates the band's group, one entry
    await r.xreadgroup(keys.GROUP, "w1", {keys.stream("q1", 5): ">"}, count=10)
    tid = await dead_letter(r, "q1", band=5)
    await admin_dlq.requeue(r, tid, CALL, CFG)
    got = await r.xreadgroup(keys.GROUP, "w2", {keys.stream("q1", 5): ">"}, count=10)
    assert [e[1][b"task_id"].decode() for e in got[0][1]] == [tid]
