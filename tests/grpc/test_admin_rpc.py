"""dtq.v1.Admin through a real gRPC channel: conversion, validation, audit identity."""

from __future__ import annotations

import grpc
import pytest

from dtq_gateway.store import keys
from dtq_proto import dtq_pb2 as pb
from tests.support.admin_seed import dead_letter, now_ms, put_task, put_worker
from tests.support.leasing import error_field, error_reason
from tests.support.ops_server import ops_server


@pytest.fixture
async def ops(redis_url: str):
    async with ops_server(redis_url) as srv:
        yield srv


async def test_list_queues_and_stats(ops) -> None:
    await put_task(ops.redis, "q1", band=9)
    await put_task(ops.redis, "q1", band=2)
    await dead_letter(ops.redis, "q1")
    queues = (await ops.admin.ListQueues(pb.ListQueuesRequest())).queues
    assert [(q.name, q.depth, q.pending, q.paused) for q in queues] == [("q1", 2, 0, False)]
    stats = await ops.admin.GetQueueStats(pb.GetQueueStatsRequest(queue="q1"))
    assert [b.band for b in stats.bands] == list(range(9, -1, -1))
    assert (stats.depth, stats.dead_letter_depth) == (2, 1)
    assert stats.oldest_task_age_ms >= 0


async def test_list_queues_pages(ops) -> None:
    await ops.redis.zadd(keys.QUEUES, {f"p{i:04d}": 0 for i in range(150)})
    first = await ops.admin.ListQueues(pb.ListQueuesRequest())  # default page: 100
    assert [q.name for q in first.queues] == [f"p{i:04d}" for i in range(100)]
    assert first.next_page_token == "p0099"
    rest = await ops.admin.ListQueues(pb.ListQueuesRequest(
        page_size=1000, page_token=first.next_page_token))
    assert [q.name for q in rest.queues] == [f"p{i:04d}" for i in range(100, 150)]
    assert rest.next_page_token == ""


@pytest.mark.parametrize("request_,field", [
    (pb.ListQueuesRequest(page_token="no such token!"), "page_token"),
    (pb.ListQueuesRequest(page_size=1001), "page_size")])
async def test_list_queues_bad_page_arguments(ops, request_, field) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await ops.admin.ListQueues(request_)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(exc.value) == "INVALID_FIELD" and error_field(exc.value) == field


@pytest.mark.parametrize("queue,code,reason", [
    ("bad name", grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD"),
    ("missing", grpc.StatusCode.NOT_FOUND, "QUEUE_NOT_FOUND")])
async def test_queue_stats_errors(ops, queue, code, reason) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await ops.admin.GetQueueStats(pb.GetQueueStatsRequest(queue=queue))
    assert exc.value.code() == code and error_reason(exc.value) == reason
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        assert error_field(exc.value) == "queue"


async def test_pause_echoes_request_id_and_audits(ops) -> None:
    call = ops.admin.PauseQueue(pb.PauseQueueRequest(queue="q1", reason="maint", create=True),
                                metadata=(("x-request-id", "abc-123"),))
    resp = await call
    assert (resp.changed, resp.request_id) == (True, "abc-123")
    assert ("x-request-id", "abc-123") in tuple(await call.trailing_metadata())
    again = await ops.admin.PauseQueue(pb.PauseQueueRequest(queue="q1"))
    assert not again.changed and len(again.request_id) == 32  # generated uuid hex
    audit = (await ops.admin.ListAudit(pb.ListAuditRequest(page_size=1))).entries
    assert (audit[0].action, audit[0].actor, audit[0].task_id) == (
        "pause_queue", "anonymous", "q1")
    assert (await ops.admin.ResumeQueue(pb.ResumeQueueRequest(queue="q1"))).changed


async def test_pause_or_resume_of_an_unknown_queue_is_not_found(ops) -> None:
    for call in (ops.admin.PauseQueue(pb.PauseQueueRequest(queue="never-made")),
                 ops.admin.ResumeQueue(pb.ResumeQueueRequest(queue="never-made"))):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await call
        assert exc.value.code() == grpc.StatusCode.NOT_FOUND
        assert error_reason(exc.value) == "QUEUE_NOT_FOUND" and "never-made" in exc.value.details()
    assert not (await ops.admin.ListAudit(pb.ListAuditRequest())).entries  # nothing audited
    assert await ops.redis.exists(keys.paused("never-made")) == 0


async def test_pause_with_create_makes_the_queue(ops) -> None:
    resp = await ops.admin.PauseQueue(pb.PauseQueueRequest(queue="fresh", create=True))
    assert resp.changed
    names = [q.name for q in (await ops.admin.ListQueues(pb.ListQueuesRequest())).queues]
    assert "fresh" in names
    stats = await ops.admin.GetQueueStats(pb.GetQueueStatsRequest(queue="fresh"))
    assert stats.paused and stats.depth == 0
    assert (await ops.admin.ResumeQueue(pb.ResumeQueueRequest(queue="fresh"))).changed
    assert not (await ops.admin.ResumeQueue(pb.ResumeQueueRequest(queue="fresh"))).changed


async def test_pause_of_a_queue_with_tasks_needs_no_flag(ops) -> None:
    await put_task(ops.redis, "busy", band=3)
    assert (await ops.admin.PauseQueue(pb.PauseQueueRequest(queue="busy"))).changed


async def test_dead_letter_roundtrip(ops) -> None:
    tid = await dead_letter(ops.redis, "q1", error_class="Timeout")
    other = await dead_letter(ops.redis, "q1")
    page = await ops.admin.ListDeadLetters(pb.ListDeadLettersRequest(page_size=1))
    assert page.entries[0].task_id == other and page.next_page_token
    entry = (await ops.admin.ListDeadLetters(pb.ListDeadLettersRequest(
        page_token=page.next_page_token))).entries[0]
    assert (entry.task_id, entry.queue, entry.last_error_class, entry.attempts_made,
            entry.payload) == (tid, "q1", "Timeout", 3, b'{"x":1}')
    await ops.admin.RequeueDeadLetter(pb.RequeueDeadLetterRequest(task_id=tid))
    await ops.admin.DiscardDeadLetter(pb.DiscardDeadLetterRequest(task_id=other))
    tasks = (await ops.admin.ListRecentTasks(pb.ListRecentTasksRequest())).tasks
    by_id = {t.task_id: t for t in tasks}
    assert by_id[tid].status == pb.TASK_STATUS_QUEUED and by_id[tid].attempt == 1
    assert [a.outcome for a in by_id[tid].attempts] == ["failed"] * 3
    assert by_id[other].status == pb.TASK_STATUS_DEAD_LETTERED
    assert by_id[other].metadata["discarded"] == "true"
    assert all(t.payload == b"" for t in tasks)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await ops.admin.RequeueDeadLetter(pb.RequeueDeadLetterRequest(task_id=other))
    assert (exc.value.code(), error_reason(exc.value)) == (
        grpc.StatusCode.NOT_FOUND, "DEAD_LETTER_NOT_FOUND")
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await ops.admin.RequeueDeadLetter(pb.RequeueDeadLetterRequest(task_id=tid))
    assert (exc.value.code(), error_reason(exc.value)) == (
        grpc.StatusCode.FAILED_PRECONDITION, "WRONG_STATE")


async def test_purge_and_redrive(ops) -> None:
    for _ in range(3):
        await dead_letter(ops.redis, "q1", task_type="a")
    dry = await ops.admin.RedriveDeadLetters(pb.RedriveDeadLettersRequest(
        task_type="a", dry_run=True))
    assert (dry.matched, dry.requeued, len(dry.task_ids)) == (3, 0, 3)
    done = await ops.admin.RedriveDeadLetters(pb.RedriveDeadLettersRequest(limit=2))
    assert (done.matched, done.requeued) == (2, 2)
    purged = await ops.admin.PurgeDeadLetters(pb.PurgeDeadLettersRequest())
    assert purged.purged == 1 and await ops.redis.xlen(keys.dead_letter("q1")) == 0


@pytest.mark.parametrize("req,field", [
    (pb.RedriveDeadLettersRequest(limit=100_001), "limit"),
    (pb.RedriveDeadLettersRequest(min_age_ms=5, max_age_ms=1), "max_age_ms"),
    (pb.RedriveDeadLettersRequest(task_type="bad type"), "task_type"),
    (pb.RedriveDeadLettersRequest(queue="a:b"), "queue")])
async def test_redrive_invalid_arguments_name_field(ops, req, field) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await ops.admin.RedriveDeadLetters(req)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_field(exc.value) == field


async def test_list_workers_and_recent_filters(ops) -> None:
    await put_worker(ops.redis, "w1", last_heartbeat_ms=await now_ms(ops.redis))
    workers = (await ops.admin.ListWorkers(pb.ListWorkersRequest())).workers
    assert [(w.worker_id, w.alive, w.status) for w in workers] == [("w1", True, "alive")]
    await put_task(ops.redis, "q1")
    done = await put_task(ops.redis, "q2", status="succeeded")
    tasks = (await ops.admin.ListRecentTasks(pb.ListRecentTasksRequest(
        status=pb.TASK_STATUS_SUCCEEDED))).tasks
    assert [t.task_id for t in tasks] == [done]
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await ops.admin.ListRecentTasks(pb.ListRecentTasksRequest(limit=1001))
    assert error_field(exc.value) == "limit"
