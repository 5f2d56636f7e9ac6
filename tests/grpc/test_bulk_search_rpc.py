"""CancelTasks, PurgeQueue and SearchTasks through a real gateway and gRPC channel."""

from __future__ import annotations

import json

import grpc
import pytest

from dtq_gateway.store import bulk, keys
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.support.leasing import LeaseStream, error_field, error_reason

S = pb.TaskStatus


@pytest.fixture
def admin(channel):
    return dtq_pb2_grpc.AdminStub(channel)


async def _enqueue(broker, n: int, queue: str = "q", **kw) -> list[str]:
    ids: list[str] = []
    while len(ids) < n:
        out = await broker.EnqueueBatch(pb.EnqueueBatchRequest(items=[
            pb.EnqueueRequest(queue=queue, task_type=kw.get("task_type", "t"),
                              metadata=kw.get("metadata", {}),
                              delay_ms=kw.get("delay_ms", 0))
            for _ in range(min(1000, n - len(ids)))]))
        assert all(r.task_id for r in out.results)
        ids += [r.task_id for r in out.results]
    return ids


async def _status(broker, task_id: str) -> int:
    return (await broker.GetTask(pb.GetTaskRequest(task_id=task_id))).task.status


async def _audit(admin) -> list[pb.AuditEntry]:
    return list((await admin.ListAudit(pb.ListAuditRequest())).entries)


async def test_purge_cancels_waiting_tasks_and_spares_a_started_one(broker_stub, admin,
                                                                    gateway) -> None:
    first = await _enqueue(broker_stub, 1)
    stream = await LeaseStream(broker_stub, "w1", ["q"], max_in_flight=1).open()
    try:
        (started,) = await stream.take(1)
        assert started.task_id == first[0]
        # more than one step of waiting work, queued and scheduled
        waiting = await _enqueue(broker_stub, bulk.STEP + 50)
        later = await _enqueue(broker_stub, 3, delay_ms=3_600_000)
        dry = await admin.PurgeQueue(pb.PurgeQueueRequest(queue="q", dry_run=True))
        assert (dry.matched, dry.cancelled) == (len(waiting) + 3, 0)
        assert await _status(broker_stub, waiting[0]) == S.TASK_STATUS_QUEUED
        done = await admin.PurgeQueue(pb.PurgeQueueRequest(queue="q", reason="drain"))
        assert (done.matched, done.cancelled) == (len(waiting) + 3, len(waiting) + 3)
        for tid in (waiting[0], waiting[-1], *later):
            assert await _status(broker_stub, tid) == S.TASK_STATUS_CANCELLED
        assert await _status(broker_stub, started.task_id) == S.TASK_STATUS_ACTIVE
        stats = await admin.GetQueueStats(pb.GetQueueStatsRequest(queue="q"))
        assert (stats.depth - stats.pending, stats.scheduled) == (0, 0)
        assert stats.cancelled == len(waiting) + 3
        # the started task still completes
        await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=started.lease_id)]))
        assert await _status(broker_stub, started.task_id) == S.TASK_STATUS_SUCCEEDED
    finally:
        stream.close()
    entries = [e for e in await _audit(admin) if e.action == "purge_queue"]
    assert [e.request_id for e in entries] == [done.request_id, dry.request_id]
    detail = json.loads(entries[0].detail)
    assert (entries[0].task_id, detail["matched"], detail["cancelled"], detail["reason"],
            detail["dry_run"]) == ("q", len(waiting) + 3, len(waiting) + 3, "drain", False)


async def test_cancel_by_filter_matches_type_metadata_status_and_age(broker_stub, admin,
                                                                    gateway) -> None:
    eu = await _enqueue(broker_stub, 3, task_type="mail", metadata={"region": "eu"})
    us = await _enqueue(broker_stub, 2, task_type="mail", metadata={"region": "us"})
    other = await _enqueue(broker_stub, 2, task_type="sms", metadata={"region": "eu"})
    later = await _enqueue(broker_stub, 1, task_type="mail", metadata={"region": "eu"},
                           delay_ms=3_600_000)
    flt = pb.TaskFilter(queue="q", task_type="mail", metadata={"region": "eu"},
                        statuses=[S.TASK_STATUS_QUEUED])
    dry = await admin.CancelTasks(pb.CancelTasksRequest(filter=flt, dry_run=True))
    assert (dry.matched, dry.cancelled, sorted(dry.task_ids)) == (3, 0, sorted(eu))
    # created at least an hour ago: none of them
    old = await admin.CancelTasks(pb.CancelTasksRequest(filter=pb.TaskFilter(
        queue="q", min_age_ms=3_600_000)))
    assert (old.matched, old.cancelled) == (0, 0)
    done = await admin.CancelTasks(pb.CancelTasksRequest(filter=flt, reason="eu outage"))
    assert (done.matched, done.cancelled, sorted(done.task_ids)) == (3, 3, sorted(eu))
    for tid in eu:
        assert await _status(broker_stub, tid) == S.TASK_STATUS_CANCELLED
    for tid in us + other:
        assert await _status(broker_stub, tid) == S.TASK_STATUS_QUEUED
    assert await _status(broker_stub, later[0]) == S.TASK_STATUS_SCHEDULED
    stream = await LeaseStream(broker_stub, "w1", ["q"], max_in_flight=10).open()
    try:
        got = await stream.take(4)
        assert sorted(t.task_id for t in got) == sorted(us + other)
    finally:
        stream.close()
    (entry, *_) = [e for e in await _audit(admin) if e.action == "cancel_tasks"]
    detail = json.loads(entry.detail)
    assert (entry.request_id, detail["metadata"], detail["cancelled"]) == (
        done.request_id, {"region": "eu"}, 3)


async def test_cancel_tasks_flags_active_tasks_only_when_asked(broker_stub, admin,
                                                                gateway) -> None:
    (running,) = await _enqueue(broker_stub, 1, metadata={"batch": "7"})
    stream = await LeaseStream(broker_stub, "w1", ["q"], max_in_flight=1).open()
    try:
        (started,) = await stream.take(1)
        assert started.task_id == running
        waiting = await _enqueue(broker_stub, 2, metadata={"batch": "7"})
        flt = pb.TaskFilter(queue="q", metadata={"batch": "7"})
        plain = await admin.CancelTasks(pb.CancelTasksRequest(filter=flt))
        assert (plain.matched, plain.cancelled, plain.cancel_requested) == (2, 2, 0)
        task = (await broker_stub.GetTask(pb.GetTaskRequest(task_id=running))).task
        assert task.status == S.TASK_STATUS_ACTIVE and not task.cancel_requested
        flt.statuses.append(S.TASK_STATUS_ACTIVE)
        dry = await admin.CancelTasks(pb.CancelTasksRequest(filter=flt, dry_run=True))
        assert (dry.matched, dry.cancel_requested, list(dry.task_ids)) == (1, 0, [running])
        done = await admin.CancelTasks(pb.CancelTasksRequest(filter=flt))
        assert (done.matched, done.cancelled, done.cancel_requested) == (1, 0, 1)
        task = (await broker_stub.GetTask(pb.GetTaskRequest(task_id=running))).task
        assert task.status == S.TASK_STATUS_ACTIVE and task.cancel_requested
        assert {await _status(broker_stub, t) for t in waiting} == {S.TASK_STATUS_CANCELLED}
    finally:
        stream.close()


@pytest.mark.parametrize("req,field", [
    (pb.CancelTasksRequest(), "filter.queue"),
    (pb.CancelTasksRequest(filter=pb.TaskFilter(queue="a:b")), "filter.queue"),
    (pb.CancelTasksRequest(filter=pb.TaskFilter(
        queue="q", statuses=[S.TASK_STATUS_SUCCEEDED])), "filter.statuses"),
    (pb.CancelTasksRequest(filter=pb.TaskFilter(queue="q", task_type="bad type")),
     "filter.task_type"),
    (pb.CancelTasksRequest(filter=pb.TaskFilter(queue="q", min_age_ms=5, max_age_ms=1)),
     "filter.max_age_ms"),
    (pb.CancelTasksRequest(filter=pb.TaskFilter(queue="q"), limit=1_000_001), "limit")])
async def test_cancel_tasks_bad_input_names_the_field_and_changes_nothing(
        broker_stub, admin, gateway, req, field) -> None:
    (tid,) = await _enqueue(broker_stub, 1)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await admin.CancelTasks(req)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_field(exc.value) == field
    assert await _status(broker_stub, tid) == S.TASK_STATUS_QUEUED
    assert not [e for e in await _audit(admin) if e.action == "cancel_tasks"]


async def test_purge_of_an_unknown_queue_is_not_found(admin, gateway) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await admin.PurgeQueue(pb.PurgeQueueRequest(queue="nope"))
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_reason(exc.value) == "QUEUE_NOT_FOUND"


async def test_search_finds_tasks_by_metadata_type_status_and_time(broker_stub, admin,
                                                                  gateway) -> None:
    noise = await _enqueue(broker_stub, 300, task_type="mail", metadata={"user": "1"})
    (hit,) = await _enqueue(broker_stub, 1, task_type="mail", metadata={"user": "42"})
    more = await _enqueue(broker_stub, 5, task_type="sms", metadata={"user": "42"})
    found = await admin.SearchTasks(pb.SearchTasksRequest(filter=pb.TaskFilter(
        metadata={"user": "42"}, task_type="mail")))
    assert [t.task_id for t in found.tasks] == [hit]
    assert found.tasks[0].metadata["user"] == "42" and not found.tasks[0].payload
    # paged, newest first, every task once (ties of one EnqueueBatch millisecond)
    seen, token = [], ""
    while True:
        page = await admin.SearchTasks(pb.SearchTasksRequest(
            filter=pb.TaskFilter(queue="q", statuses=[S.TASK_STATUS_QUEUED]),
            page_size=40, page_token=token))
        seen += [t.task_id for t in page.tasks]
        token = page.next_page_token
        if not token:
            break
    assert sorted(seen) == sorted(noise + [hit] + more) and len(seen) == len(set(seen))
    # a time range before every task finds none; statuses that none has find none
    created = (await broker_stub.GetTask(pb.GetTaskRequest(task_id=noise[0]))
               ).task.created_at_ms
    assert not (await admin.SearchTasks(pb.SearchTasksRequest(filter=pb.TaskFilter(
        created_before_ms=created)))).tasks
    assert not (await admin.SearchTasks(pb.SearchTasksRequest(filter=pb.TaskFilter(
        statuses=[S.TASK_STATUS_SUCCEEDED])))).tasks


async def test_search_reads_a_bounded_number_of_entries_per_page(broker_stub, admin,
                                                                gateway) -> None:
    await _enqueue(broker_stub, 1200, task_type="mail")
    page = await admin.SearchTasks(pb.SearchTasksRequest(filter=pb.TaskFilter(
        task_type="nothing-matches")))
    assert (len(page.tasks), page.examined) == (0, 1000) and page.next_page_token
    rest = await admin.SearchTasks(pb.SearchTasksRequest(filter=pb.TaskFilter(
        task_type="nothing-matches"), page_token=page.next_page_token))
    assert (rest.examined, rest.next_page_token) == (200, "")
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await admin.SearchTasks(pb.SearchTasksRequest(page_token="x"))
    assert error_field(exc.value) == "page_token"
    assert keys.RECENT_TASKS  # the index searched (docs/redis-layout.md)


@pytest.mark.parametrize("method,req", [
    ("PurgeQueue", pb.PurgeQueueRequest(queue="q")),
    ("CancelTasks", pb.CancelTasksRequest(filter=pb.TaskFilter(queue="q"))),
    ("SearchTasks", pb.SearchTasksRequest())])
async def test_bulk_and_search_need_the_admin_role(redis_url, method, req) -> None:
    from tests.support.ops_server import ops_server

    tokens = "adm-token-1=admin:ops,prod-token-1=producer:app"
    async with ops_server(redis_url, auth_tokens=tokens) as srv:
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await getattr(srv.admin, method)(
                req, metadata=(("authorization", "Bearer prod-token-1"),))
        assert exc.value.code() == grpc.StatusCode.PERMISSION_DENIED
