"""dtq.v1.Broker through a real gRPC channel against an in-process gateway."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import grpc
import pytest
import redis.asyncio as aioredis

from dtq_proto import dtq_pb2 as pb
from tests.support.leasing import LeaseStream, error_field, error_reason


def enq(queue="q", task_type="t", payload=b"{}", **kw) -> pb.EnqueueRequest:
    return pb.EnqueueRequest(queue=queue, task_type=task_type, payload=payload, **kw)


async def test_enqueue_lease_ack_roundtrip(broker_stub):
    r = await broker_stub.Enqueue(enq(payload=b'{"n": 1}', metadata={"k": "v"}))
    assert r.status == pb.TASK_STATUS_QUEUED and not r.deduplicated
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    assert lease.session.heartbeat_interval_ms == 500
    task = await lease.next()
    assert (task.task_id, task.payload, task.attempt, task.metadata["k"]) == \
        (r.task_id, b'{"n": 1}', 1, "v")
    ack = await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=task.lease_id,
                                                                result=b'{"ok":true}')]))
    assert ack.results[0].status == pb.TASK_STATUS_SUCCEEDED
    got = (await broker_stub.GetTask(pb.GetTaskRequest(task_id=r.task_id))).task
    assert got.status == pb.TASK_STATUS_SUCCEEDED
    assert got.result == b'{"ok":true}'
    assert [a.outcome for a in got.attempts] == ["succeeded"]
    lease.close()


async def test_strict_priority_across_queues(broker_stub):
    for queue, prio in [("a", 1), ("b", 9), ("a", 5), ("b", 0), ("a", 9)]:
        await broker_stub.Enqueue(enq(queue=queue, priority=prio,
                                      payload=json.dumps([queue, prio]).encode()))
    lease = await LeaseStream(broker_stub, "w1", ["a", "b"], max_in_flight=5).open()
    tasks = await lease.take(5)
    assert [t.priority for t in tasks] == [9, 9, 5, 1, 0]
    lease.close()


async def test_max_in_flight_is_never_exceeded(broker_stub):
    await broker_stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[enq() for _ in range(6)]))
    lease = await LeaseStream(broker_stub, "w1", ["q"], max_in_flight=2).open()
    first = await lease.take(2)
    with pytest.raises(asyncio.TimeoutError):
        await lease.next(timeout_s=0.5)
    await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=first[0].lease_id)]))
    third = await lease.next()
    assert third.task_id not in {t.task_id for t in first}
    lease.close()


async def test_pel_limit_holds_across_sessions_of_one_worker(broker_stub):
    await broker_stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[enq() for _ in range(4)]))
    first = await LeaseStream(broker_stub, "w1", ["q"], max_in_flight=2).open()
    await first.take(2)
    first.close()  # the leases stay with worker w1 in the PEL
    second = await LeaseStream(broker_stub, "w1", ["q"], max_in_flight=2).open()
    with pytest.raises(asyncio.TimeoutError):
        await second.next(timeout_s=0.5)
    second.close()


async def test_idle_worker_gets_new_task_quickly(redis_url, monkeypatch):
    """The enqueue itself wakes the dispatcher for an idle worker. Its periodic re-check
    (the tick, 1 s in production) is a minute away here, so a task that arrives within
    the wait came by that wake-up, however slow the machine is."""
    from functools import partial

    from dtq_gateway import server
    from dtq_gateway.leasing.dispatch import Dispatcher
    from dtq_proto import dtq_pb2_grpc
    from tests.conftest import gateway_settings

    monkeypatch.setattr(server, "Dispatcher", partial(Dispatcher, tick_s=60.0))
    gw = server.Gateway(gateway_settings(redis_url), redis_url)
    await gw.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
            stub = dtq_pb2_grpc.BrokerStub(ch)
            lease = await LeaseStream(stub, "w1", ["q"]).open()
            await stub.Enqueue(enq(priority=0))
            task = await lease.next(timeout_s=10)  # far below the 60 s tick
            assert task.priority == 0
            lease.close()
    finally:
        await gw.stop()


async def test_stale_and_duplicate_ack(broker_stub):
    await broker_stub.Enqueue(enq())
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    task = await lease.next()
    await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=task.lease_id)]))
    again = await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=task.lease_id)]))
    assert again.results[0].duplicate
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await broker_stub.Fail(pb.FailRequest(items=[pb.FailItem(lease_id=task.lease_id)]))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(err.value) == "STALE_LEASE"
    lease.close()


async def test_batch_items_answered_individually(broker_stub):
    await broker_stub.Enqueue(enq())
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    task = await lease.next()
    res = await broker_stub.Ack(pb.AckRequest(items=[
        pb.AckItem(lease_id=task.lease_id), pb.AckItem(lease_id="garbage")]))
    assert res.results[0].status == pb.TASK_STATUS_SUCCEEDED
    assert res.results[1].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert res.results[1].error.field == "items[1].lease_id"
    lease.close()


async def test_retry_then_dead_letter(broker_stub, redis_url):
    r = await broker_stub.Enqueue(enq(max_attempts=2, retry_policy=pb.RetryPolicy(
        backoff_base_ms=1, backoff_cap_ms=1)))
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    first = await lease.next()
    await broker_stub.Fail(pb.FailRequest(items=[pb.FailItem(
        lease_id=first.lease_id, error_message="boom", error_class="ValueError")]))
    client = aioredis.Redis.from_url(redis_url)
    second = await lease.next(timeout_s=5)
    assert second.attempt == 2 and second.task_id == r.task_id
    await broker_stub.Fail(pb.FailRequest(items=[pb.FailItem(
        lease_id=second.lease_id, error_message="boom again", error_class="ValueError")]))
    got = (await broker_stub.GetTask(pb.GetTaskRequest(task_id=r.task_id))).task
    assert got.status == pb.TASK_STATUS_DEAD_LETTERED
    assert [a.outcome for a in got.attempts] == ["failed", "failed"]
    entries = await client.xrange("dtq:stream:{q}:dead-letter")
    assert entries[0][1][b"last_error_class"] == b"ValueError"
    assert entries[0][1][b"attempts_made"] == b"2"
    await client.aclose()
    lease.close()


async def test_release_keeps_the_attempt(broker_stub):
    r = await broker_stub.Enqueue(enq())
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    task = await lease.next()
    res = await broker_stub.Fail(pb.FailRequest(items=[pb.FailItem(
        lease_id=task.lease_id, mode=pb.FAIL_MODE_RELEASE)]))
    assert res.results[0].status == pb.TASK_STATUS_QUEUED
    again = await lease.next()
    assert (again.task_id, again.attempt) == (r.task_id, 1)
    lease.close()


async def test_non_retryable_goes_straight_to_dlq(broker_stub):
    await broker_stub.Enqueue(enq(max_attempts=5))
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    task = await lease.next()
    res = await broker_stub.Fail(pb.FailRequest(items=[pb.FailItem(
        lease_id=task.lease_id, retryable=False, error_class="Corrupt")]))
    assert res.results[0].status == pb.TASK_STATUS_DEAD_LETTERED
    lease.close()


async def test_idempotent_enqueue(broker_stub):
    a = await broker_stub.Enqueue(enq(idempotency_key="order-1"))
    b = await broker_stub.Enqueue(enq(idempotency_key="order-1"))
    other_queue = await broker_stub.Enqueue(enq(queue="other", idempotency_key="order-1"))
    assert b.deduplicated and b.task_id == a.task_id
    assert not other_queue.deduplicated


@pytest.mark.parametrize("request_, field", [
    (enq(queue="bad queue"), "queue"),
    (enq(task_type=""), "task_type"),
    (enq(priority=10), "priority"),
    (enq(payload=b"{not json"), "payload"),
    (enq(delay_ms=5, not_before_ms=5), "delay_ms"),
    (enq(max_attempts=1000), "max_attempts"),
])
async def test_bad_enqueue_names_the_field_and_writes_nothing(broker_stub, redis_url,
                                                              request_, field):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await broker_stub.Enqueue(request_)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(err.value) == "INVALID_FIELD"
    assert error_field(err.value) == field
    client = aioredis.Redis.from_url(redis_url)
    assert [k async for k in client.scan_iter("dtq:task:*")] == []
    await client.aclose()


async def test_depth_gate(redis_url):
    from dtq_gateway.server import Gateway
    from dtq_proto import dtq_pb2_grpc
    from tests.conftest import gateway_settings

    gw = Gateway(gateway_settings(redis_url, max_queue_depth=2), redis_url)
    await gw.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
            stub = dtq_pb2_grpc.BrokerStub(ch)
            await stub.Enqueue(enq())
            await stub.Enqueue(enq())
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Enqueue(enq())
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert error_reason(err.value) == "QUEUE_FULL"
    finally:
        await gw.stop()


async def test_cancel_queued_task_is_never_delivered(broker_stub):
    a = await broker_stub.Enqueue(enq(priority=9))
    b = await broker_stub.Enqueue(enq(priority=1))
    c = await broker_stub.CancelTask(pb.CancelTaskRequest(task_id=a.task_id, reason="test"))
    assert c.status == pb.TASK_STATUS_CANCELLED
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    task = await lease.next()
    assert task.task_id == b.task_id
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await broker_stub.CancelTask(pb.CancelTaskRequest(task_id=a.task_id))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    lease.close()


async def test_cancel_running_task_reported_by_heartbeat(broker_stub):
    r = await broker_stub.Enqueue(enq())
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    task = await lease.next()
    c = await broker_stub.CancelTask(pb.CancelTaskRequest(task_id=r.task_id))
    assert c.cancel_requested and c.status == pb.TASK_STATUS_ACTIVE
    hb = await broker_stub.Heartbeat(pb.HeartbeatRequest(worker_id="w1",
                                                         lease_ids=[task.lease_id]))
    assert list(hb.cancelled_lease_ids) == [task.lease_id]
    res = await broker_stub.Fail(pb.FailRequest(items=[pb.FailItem(
        lease_id=task.lease_id, mode=pb.FAIL_MODE_CANCELLED)]))
    assert res.results[0].status == pb.TASK_STATUS_CANCELLED
    lease.close()


async def test_heartbeat_reports_foreign_and_unknown_leases_lost(broker_stub):
    await broker_stub.Enqueue(enq())
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    task = await lease.next()
    hb = await broker_stub.Heartbeat(pb.HeartbeatRequest(
        worker_id="w2", lease_ids=[task.lease_id, "nonsense"]))
    assert set(hb.lost_lease_ids) == {task.lease_id, "nonsense"}
    ok = await broker_stub.Heartbeat(pb.HeartbeatRequest(worker_id="w1",
                                                         lease_ids=[task.lease_id]))
    assert not ok.lost_lease_ids and not ok.cancelled_lease_ids
    lease.close()


async def test_get_unknown_task(broker_stub):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await broker_stub.GetTask(pb.GetTaskRequest(task_id="0" * 32))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await broker_stub.GetTask(pb.GetTaskRequest(task_id="x"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_closing_a_session_releases_undelivered_leases(broker_stub, gateway):
    # Nothing is lost when a stream closes: leases still queued in the gateway are handed
    # back at once, and those already written to the dead stream are reclaimed by the
    # reaper after the visibility timeout (2 s here).
    await broker_stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[enq() for _ in range(3)]))
    lease = await LeaseStream(broker_stub, "w1", ["q"], max_in_flight=3).open()
    await lease.next()
    lease.close()
    other = await LeaseStream(broker_stub, "w2", ["q"], max_in_flight=3).open()
    got = await other.take(2, timeout_s=10)
    assert len({t.task_id for t in got}) == 2
    other.close()


async def test_draining_heartbeat_ends_the_stream_after_every_sent_lease(broker_stub):
    await broker_stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[enq() for _ in range(5)]))
    lease = await LeaseStream(broker_stub, "w1", ["q"], max_in_flight=3).open()
    got = await lease.take(3)
    await broker_stub.Heartbeat(pb.HeartbeatRequest(
        worker_id="w1", lease_ids=[t.lease_id for t in got], draining=True))
    # the stream ends with OK (no error) after the leases already sent
    with pytest.raises(EOFError):
        await lease.next()
    res = await broker_stub.Fail(pb.FailRequest(items=[
        pb.FailItem(lease_id=t.lease_id, mode=pb.FAIL_MODE_RELEASE) for t in got]))
    assert [r.status for r in res.results] == [pb.TASK_STATUS_QUEUED] * 3
    other = await LeaseStream(broker_stub, "w2", ["q"], max_in_flight=5).open()
    got_other = await other.take(5)
    assert len({t.task_id for t in got_other}) == 5
    assert all(t.attempt == 1 for t in got_other)  # nothing was burned by the drain
    other.close()


async def test_draining_survives_the_stream_end_and_shows_in_list_workers(broker_stub, channel):
    from dtq_proto import dtq_pb2_grpc

    admin = dtq_pb2_grpc.AdminStub(channel)
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    await broker_stub.Heartbeat(pb.HeartbeatRequest(worker_id="w1", draining=True))
    with pytest.raises(EOFError):
        await lease.next()  # the stream ended; its "stopped" record must not undo draining
    await broker_stub.Heartbeat(pb.HeartbeatRequest(worker_id="w1"))  # a late plain beat
    workers = (await admin.ListWorkers(pb.ListWorkersRequest())).workers
    assert [(w.worker_id, w.status) for w in workers] == [("w1", "draining")]
    await broker_stub.Enqueue(enq())
    other = await LeaseStream(broker_stub, "w1", ["q"], heartbeat=False).open()
    # a new session of the same worker id starts it afresh
    assert (await other.next()).attempt == 1
    other.close()


async def test_absolute_times_out_of_bounds_name_their_field(broker_stub):
    now_ms = int(time.time() * 1000)
    bad = [(enq(not_before_ms=now_ms * 1000), "not_before_ms"),      # microseconds
           (enq(not_before_ms=now_ms // 1000), "not_before_ms"),      # seconds
           (enq(not_before_ms=now_ms + 400 * 86_400_000), "not_before_ms"),
           (enq(expires_at_ms=now_ms // 1000), "expires_at_ms"),      # seconds: long past
           (enq(expires_at_ms=now_ms * 1000), "expires_at_ms"),
           (enq(expires_at_ms=now_ms - 3_600_000), "expires_at_ms")]  # an hour ago
    for req, field in bad:
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await broker_stub.Enqueue(req)
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
        assert error_field(exc.value) == field
    batch = await broker_stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[
        enq(not_before_ms=now_ms * 1000), enq(not_before_ms=now_ms + 60_000)]))
    assert batch.results[0].error.field == "items[0].not_before_ms"
    assert batch.results[1].status == pb.TASK_STATUS_SCHEDULED
    ok = await broker_stub.Enqueue(enq(not_before_ms=now_ms - 1000,
                                       expires_at_ms=now_ms + 60_000))
    assert ok.status == pb.TASK_STATUS_QUEUED  # a due time just past runs at once


async def test_cancelled_lease_streams_log_no_servicer_error(gateway, broker_stub, caplog):
    """A worker that cancels its Lease stream while leases are being written is a
    normal end: grpc must not log it as an error raised by the Lease servicer."""
    caplog.set_level(logging.WARNING, logger="grpc")
    item = pb.EnqueueRequest(queue="cq", task_type="t", payload=b"x" * 200_000,
                             content_type="application/octet-stream")
    await broker_stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[item] * 200))
    for i in range(20):
        call = broker_stub.Lease(pb.LeaseRequest(worker_id=f"cw{i}", queues=["cq"],
                                                 max_in_flight=200))
        async for n, _ in _enumerate(call):
            if n == 2:
                break
        call.cancel()
    deadline = time.monotonic() + 10
    while gateway.dispatcher.sessions:  # every Lease servicer has ended
        assert time.monotonic() < deadline, "Lease sessions still open"
        await asyncio.sleep(0.02)
    errors = [r for r in caplog.records if r.name.startswith("grpc") and r.levelno >= logging.ERROR]
    assert errors == []


async def _enumerate(call):
    n = 0
    async for message in call:
        yield n, message
        n += 1
