"""Admin.DeleteQueue through a real gateway on a real Redis: what it deletes, what it
refuses, dry runs, and that the name works again afterwards."""

from __future__ import annotations

import grpc
import pytest
import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from dtq_gateway.store import keys, queue_delete
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.support.leasing import LeaseStream, error_field, error_reason, poll
from tests.support.ops_server import ops_server


@pytest.fixture
async def admin(channel):
    return dtq_pb2_grpc.AdminStub(channel)


@pytest.fixture
async def r(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def _existing(r, queue: str) -> list[str]:
    return sorted([k for k in queue_delete.queue_keys(queue) if await r.exists(k)])


async def _refusal(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await call
    return exc.value


async def test_deletes_a_drained_paused_queue_with_everything_and_the_name_works_again(
        gateway, broker_stub, admin, r) -> None:
    await admin.SetRateLimit(pb.SetRateLimitRequest(rate_limit=pb.RateLimit(
        queue="old", limit=1000, period_ms=1000)))
    await broker_stub.Enqueue(pb.EnqueueRequest(queue="old", task_type="t", payload=b"{}"))
    worker = await LeaseStream(broker_stub, "w-old", ["old"]).open()
    task = await worker.next()
    await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=task.lease_id)]))
    worker.close()
    await admin.PauseQueue(pb.PauseQueueRequest(queue="old"))
    before = await _existing(r, "old")
    assert {keys.stream("old", 5), keys.paused("old"), keys.queue_counters("old"),
            keys.rate_limit("old")} <= set(before)

    dry = await admin.DeleteQueue(pb.DeleteQueueRequest(queue="old", dry_run=True))
    assert (dry.deleted, dry.dry_run, sorted(dry.keys)) == (False, True, before)
    assert await _existing(r, "old") == before  # a dry run changes nothing
    assert [q.name for q in (await admin.ListQueues(pb.ListQueuesRequest())).queues] == ["old"]

    enqueued = ("dtq_tasks_enqueued_total", {"queue": "old"})
    assert REGISTRY.get_sample_value(*enqueued) is not None
    done = await admin.DeleteQueue(pb.DeleteQueueRequest(queue="old", reason="retired"))
    assert REGISTRY.get_sample_value(*enqueued) is None  # its series left at once
    assert done.deleted and sorted(done.keys) == before and done.request_id
    assert await _existing(r, "old") == []
    assert await r.zscore(keys.QUEUES, "old") is None
    assert not await r.sismember(keys.BUSY_QUEUES, "old")
    assert not await r.sismember(keys.RATE_LIMITED_QUEUES, "old")
    assert (await admin.ListQueues(pb.ListQueuesRequest())).queues == []
    assert (await admin.ListRateLimits(pb.ListRateLimitsRequest())).rate_limits == []
    gone = await _refusal(admin.GetQueueStats(pb.GetQueueStatsRequest(queue="old")))
    assert gone.code() == grpc.StatusCode.NOT_FOUND
    entry = (await admin.ListAudit(pb.ListAuditRequest(page_size=1))).entries[0]
    assert (entry.action, entry.task_id, entry.request_id) == (
        "delete_queue", "old", done.request_id)
    assert "retired" in entry.detail and "dry_run=false" in entry.detail

    # the name is new again: groups are created at once (this replica forgot them),
    # the queue is listed, unpaused and unlimited, and its task is leased
    again = await broker_stub.Enqueue(pb.EnqueueRequest(queue="old", task_type="t",
                                                        payload=b"{}"))
    groups = await r.xinfo_groups(keys.stream("old", 5))
    assert [g["name"] for g in groups] == [keys.GROUP.encode()]
    listed = (await admin.ListQueues(pb.ListQueuesRequest())).queues
    assert [(q.name, q.depth, q.paused) for q in listed] == [("old", 1, False)]
    worker = await LeaseStream(broker_stub, "w-new", ["old"]).open()
    assert (await worker.next()).task_id == again.task_id
    worker.close()


async def test_refuses_a_queue_with_a_queued_task(gateway, broker_stub, admin, r) -> None:
    await broker_stub.Enqueue(pb.EnqueueRequest(queue="full", task_type="t", payload=b"{}"))
    before = await _existing(r, "full")
    for dry_run in (True, False):
        err = await _refusal(admin.DeleteQueue(pb.DeleteQueueRequest(queue="full",
                                                                     dry_run=dry_run)))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_reason(err) == "QUEUE_NOT_EMPTY"
        assert "depth=1 (leased=0), scheduled=0" in err.details()
    assert await _existing(r, "full") == before
    assert await r.zscore(keys.QUEUES, "full") is not None


async def test_refuses_a_queue_with_a_leased_task(gateway, broker_stub, admin) -> None:
    await broker_stub.Enqueue(pb.EnqueueRequest(queue="held", task_type="t", payload=b"{}"))
    worker = await LeaseStream(broker_stub, "w-held", ["held"]).open()
    await worker.next()
    try:
        err = await _refusal(admin.DeleteQueue(pb.DeleteQueueRequest(queue="held")))
        assert error_reason(err) == "QUEUE_NOT_EMPTY" and "leased=1" in err.details()
    finally:
        worker.close()


async def test_refuses_a_queue_with_a_scheduled_task(gateway, broker_stub, admin) -> None:
    await broker_stub.Enqueue(pb.EnqueueRequest(queue="later", task_type="t", payload=b"{}",
                                                delay_ms=600_000))
    err = await _refusal(admin.DeleteQueue(pb.DeleteQueueRequest(queue="later")))
    assert error_reason(err) == "QUEUE_NOT_EMPTY"
    assert "depth=0 (leased=0), scheduled=1" in err.details()


async def test_dead_letters_refuse_unless_discarded(gateway, broker_stub, admin, r) -> None:
    done = await broker_stub.Enqueue(pb.EnqueueRequest(queue="dl", task_type="t",
                                                       payload=b"{}"))
    worker = await LeaseStream(broker_stub, "w-dl", ["dl"]).open()
    task = await worker.next()
    await broker_stub.Fail(pb.FailRequest(items=[pb.FailItem(
        lease_id=task.lease_id, error_message="no", retryable=False)]))
    worker.close()
    err = await _refusal(admin.DeleteQueue(pb.DeleteQueueRequest(queue="dl")))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(err) == "HAS_DEAD_LETTERS" and "1 dead letters" in err.details()
    assert await r.xlen(keys.dead_letter("dl")) == 1

    gone = await admin.DeleteQueue(pb.DeleteQueueRequest(queue="dl",
                                                         discard_dead_letters=True))
    assert gone.deleted and gone.dead_letters_discarded == 1
    assert keys.dead_letter("dl") in gone.keys
    assert not await r.exists(keys.dead_letter("dl"))
    assert (await admin.ListDeadLetters(pb.ListDeadLettersRequest(queue="dl"))).entries == []
    # the record of the finished task stays until its retention ends
    record = await broker_stub.GetTask(pb.GetTaskRequest(task_id=done.task_id))
    assert record.task.status == pb.TASK_STATUS_DEAD_LETTERED


async def test_a_worker_listening_on_the_deleted_queue_gets_its_next_task(
        gateway, broker_stub, admin, r) -> None:
    worker = await LeaseStream(broker_stub, "w-listening", ["quiet"]).open()
    try:
        await broker_stub.Enqueue(pb.EnqueueRequest(queue="quiet", task_type="t",
                                                    payload=b"{}"))
        first = await worker.next()
        await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=first.lease_id)]))
        # drained, and its worker read it a moment ago and keeps listening
        done = await admin.DeleteQueue(pb.DeleteQueueRequest(queue="quiet"))
        assert done.deleted and keys.stream("quiet", 0) in done.keys
        assert await _existing(r, "quiet") == []
        task = await broker_stub.Enqueue(pb.EnqueueRequest(queue="quiet", task_type="t",
                                                           payload=b"{}"))
        assert (await worker.next()).task_id == task.task_id
    finally:
        worker.close()


async def test_a_registry_name_without_keys_is_deleted(redis_url) -> None:
    # on a bare Admin server: a gateway's idle sweep would remove the name itself
    async with ops_server(redis_url) as ops:
        await ops.redis.zadd(keys.QUEUES, {"ghost": 0})  # a crash after the script
        done = await ops.admin.DeleteQueue(pb.DeleteQueueRequest(queue="ghost"))
        assert done.deleted and list(done.keys) == []
        assert await ops.redis.zscore(keys.QUEUES, "ghost") is None


async def test_only_the_admin_role_may_delete(redis_url) -> None:
    tokens = "adm-token-1=admin:ops-alice,prod-token-1=producer:app,work-token-1=worker:w1"
    async with ops_server(redis_url, auth_tokens=tokens) as ops:
        await ops.redis.zadd(keys.QUEUES, {"kept": 0})
        for token in ("prod-token-1", "work-token-1"):
            err = await _refusal(ops.admin.DeleteQueue(
                pb.DeleteQueueRequest(queue="kept"),
                metadata=(("authorization", f"Bearer {token}"),)))
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        assert await ops.redis.zscore(keys.QUEUES, "kept") is not None
        done = await ops.admin.DeleteQueue(pb.DeleteQueueRequest(queue="kept"),
                                           metadata=(("authorization", "Bearer adm-token-1"),))
        assert done.deleted
        entry = (await ops.admin.ListAudit(pb.ListAuditRequest(page_size=1), metadata=(
            ("authorization", "Bearer adm-token-1"),))).entries[0]
        assert (entry.action, entry.actor) == ("delete_queue", "ops-alice")


@pytest.mark.parametrize("queue,code,reason,field", [
    ("never-made", grpc.StatusCode.NOT_FOUND, "QUEUE_NOT_FOUND", ""),
    ("bad name", grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", "queue"),
    ("", grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", "queue")])
async def test_unknown_and_bad_names(gateway, admin, r, queue, code, reason, field) -> None:
    for dry_run in (True, False):
        err = await _refusal(admin.DeleteQueue(pb.DeleteQueueRequest(queue=queue,
                                                                     dry_run=dry_run)))
        assert (err.code(), error_reason(err), error_field(err)) == (code, reason, field)
    assert await r.xlen(keys.AUDIT) == 0  # a refused call is not audited


async def test_a_replica_with_a_stale_group_cache_lists_and_serves_the_name_again(
        gateway, broker_stub, admin, redis_url, r) -> None:
    """Deleted through another replica (here a bare Admin server): this gateway's cache
    still says the queue's groups exist. Its next enqueue must recreate the band stream
    with its consumer group and list the name again, not leave a task in a bare,
    unlisted stream."""
    first = await broker_stub.Enqueue(pb.EnqueueRequest(queue="hy", task_type="t",
                                                        payload=b"{}"))
    await broker_stub.CancelTask(pb.CancelTaskRequest(task_id=first.task_id))
    async with ops_server(redis_url) as other:
        done = await other.admin.DeleteQueue(pb.DeleteQueueRequest(queue="hy"))
    assert done.deleted and await _existing(r, "hy") == []

    again = await broker_stub.Enqueue(pb.EnqueueRequest(queue="hy", task_type="t",
                                                        payload=b"{}", priority=5))
    groups = await r.xinfo_groups(keys.stream("hy", 5))
    assert [g["name"] for g in groups] == [keys.GROUP.encode()]
    assert await r.zscore(keys.QUEUES, "hy") == 0
    listed = await admin.ListQueues(pb.ListQueuesRequest())
    assert [(q.name, q.depth) for q in listed.queues] == [("hy", 1)]
    worker = await LeaseStream(broker_stub, "w-hy", ["hy"]).open()
    try:
        assert (await worker.next()).task_id == again.task_id
    finally:
        worker.close()


async def test_a_delayed_task_into_a_queue_deleted_elsewhere_comes_due_with_its_group(
        gateway, broker_stub, redis_url, r) -> None:
    """The same stale replica enqueues a delayed task: when it comes due, the scheduler
    moves it into a band stream that is gone; the stream comes back with its group."""
    first = await broker_stub.Enqueue(pb.EnqueueRequest(queue="hd", task_type="t",
                                                        payload=b"{}"))
    await broker_stub.CancelTask(pb.CancelTaskRequest(task_id=first.task_id))
    async with ops_server(redis_url) as other:
        assert (await other.admin.DeleteQueue(pb.DeleteQueueRequest(queue="hd"))).deleted
    later = await broker_stub.Enqueue(pb.EnqueueRequest(queue="hd", task_type="t",
                                                        payload=b"{}", priority=2,
                                                        delay_ms=200))
    await poll(lambda: r.xlen(keys.stream("hd", 2)), lambda n: n == 1, timeout_s=10)
    groups = await r.xinfo_groups(keys.stream("hd", 2))
    assert [g["name"] for g in groups] == [keys.GROUP.encode()]
    worker = await LeaseStream(broker_stub, "w-hd", ["hd"]).open()
    try:
        assert (await worker.next()).task_id == later.task_id
    finally:
        worker.close()
