"""Lifecycle rules from other queues' bug reports, through the real gRPC API."""

from __future__ import annotations

import asyncio

import pytest

from dtq_proto import dtq_pb2 as pb
from tests.support.leasing import LeaseStream, poll


def enq(**kw) -> pb.EnqueueRequest:
    return pb.EnqueueRequest(queue="q", task_type="t", payload=b"{}", **kw)


async def test_expiry_does_not_cancel_the_retry_of_a_started_task(broker_stub):
    """Expiry means "not started by": a task that started before its deadline follows its
    retry policy even when the retry comes due after the deadline (it used to expire in
    the scheduler's move, and attempt 2 never ran)."""
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()  # waiting: leased at once
    r = await broker_stub.Enqueue(enq(ttl_ms=2000, max_attempts=3))
    first = await lease.next()
    failed = await broker_stub.Fail(pb.FailRequest(items=[pb.FailItem(
        lease_id=first.lease_id, error_message="flaky", retry_after_ms=2500)]))
    assert failed.results[0].status == pb.TASK_STATUS_SCHEDULED
    second = await lease.next(timeout_s=8)  # due 2.5 s later, 0.5 s past the deadline
    assert (second.task_id, second.attempt) == (r.task_id, 2)
    await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=second.lease_id)]))
    task = (await broker_stub.GetTask(pb.GetTaskRequest(task_id=r.task_id))).task
    assert task.status == pb.TASK_STATUS_SUCCEEDED
    assert [a.outcome for a in task.attempts] == ["failed", "succeeded"]
    lease.close()


async def test_expiry_still_applies_to_a_task_that_never_started(broker_stub):
    r = await broker_stub.Enqueue(enq(delay_ms=600, ttl_ms=300))
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()

    async def status() -> int:
        return (await broker_stub.GetTask(pb.GetTaskRequest(task_id=r.task_id))).task.status

    assert await poll(status, lambda s: s != pb.TASK_STATUS_SCHEDULED, timeout_s=5) == \
        pb.TASK_STATUS_EXPIRED
    lease.close()


async def test_idempotency_key_dedupes_while_its_task_is_live_past_the_ttl(redis_url):
    """DTQ_IDEM_TTL_S=1 and a task delayed 2.5 s: an enqueue with the same key 1.5 s later
    (past the TTL, the task still scheduled) returns the first task; once the task ended
    and its enqueue + TTL passed, the key is free again."""
    import grpc

    from dtq_gateway.server import Gateway
    from dtq_proto import dtq_pb2_grpc
    from tests.conftest import gateway_settings

    gw = Gateway(gateway_settings(redis_url, idem_ttl_s=1), redis_url)
    await gw.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}")
    stub = dtq_pb2_grpc.BrokerStub(channel)
    try:
        first = await stub.Enqueue(enq(idempotency_key="K", delay_ms=2500))
        await asyncio.sleep(1.5)  # the scenario itself: the TTL passes while it waits
        again = await stub.Enqueue(enq(idempotency_key="K"))
        assert (again.task_id, again.deduplicated) == (first.task_id, True)
        lease = await LeaseStream(stub, "w1", ["q"]).open()
        task = await lease.next(timeout_s=5)
        assert task.task_id == first.task_id
        await stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=task.lease_id)]))
        lease.close()
        fresh = await stub.Enqueue(enq(idempotency_key="K"))  # ended, TTL long past
        assert not fresh.deduplicated and fresh.task_id != first.task_id
    finally:
        await channel.close()
        await gw.stop()


async def test_a_batch_is_spread_over_idle_workers(broker_stub):
    """Two idle workers (concurrency 4, max_in_flight 8) and one EnqueueBatch of 8: each
    gets 4, instead of the first one buffering all 8 while the other runs nothing."""
    w1 = await LeaseStream(broker_stub, "w1", ["q"], max_in_flight=8, concurrency=4).open()
    w2 = await LeaseStream(broker_stub, "w2", ["q"], max_in_flight=8, concurrency=4).open()
    await broker_stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[enq() for _ in range(8)]))
    first, second = await w1.take(4), await w2.take(4)
    assert len({t.task_id for t in first + second}) == 8
    for lease in (w1, w2):
        with pytest.raises(asyncio.TimeoutError):
            await lease.next(timeout_s=0.3)
        lease.close()


async def test_one_worker_still_fills_its_buffer_to_max_in_flight(broker_stub):
    lease = await LeaseStream(broker_stub, "w1", ["q"], max_in_flight=8, concurrency=4).open()
    await broker_stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[enq() for _ in range(10)]))
    assert len({t.task_id for t in await lease.take(8)}) == 8
    with pytest.raises(asyncio.TimeoutError):
        await lease.next(timeout_s=0.3)
    lease.close()


def _count(name: str, queue: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, {"queue": queue}) or 0.0


async def test_outcome_counters_count_queued_cancels_and_expiry_at_lease_time(broker_stub):
    cancelled0 = _count("dtq_tasks_cancelled_total", "mq")
    expired0 = _count("dtq_tasks_expired_total", "mq")
    queued = await broker_stub.Enqueue(enq_to("mq"))
    await broker_stub.CancelTask(pb.CancelTaskRequest(task_id=queued.task_id))
    doomed = await broker_stub.Enqueue(enq_to("mq", ttl_ms=1))
    await asyncio.sleep(0.01)  # the scenario: its 1 ms deadline passes before any read
    lease = await LeaseStream(broker_stub, "w1", ["mq"]).open()

    async def status() -> int:
        return (await broker_stub.GetTask(pb.GetTaskRequest(task_id=doomed.task_id))).task.status

    assert await poll(status, lambda s: s == pb.TASK_STATUS_EXPIRED, timeout_s=5)
    assert _count("dtq_tasks_cancelled_total", "mq") == cancelled0 + 1
    assert _count("dtq_tasks_expired_total", "mq") == expired0 + 1
    lease.close()


def enq_to(queue: str, **kw) -> pb.EnqueueRequest:
    return pb.EnqueueRequest(queue=queue, task_type="t", payload=b"{}", **kw)


async def _ack_slowly(stub, lease: LeaseStream, every_s: float, stop: asyncio.Event) -> int:
    """Ack each task of ``lease`` after ``every_s``: a steady load of wake-ups."""
    acked = 0
    while not stop.is_set():
        try:
            task = await lease.next(timeout_s=0.2)
        except TimeoutError:
            continue
        await asyncio.sleep(every_s)  # the scenario: a worker busy every_s per task
        await stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=task.lease_id)]))
        acked += 1
    return acked


async def test_credit_freed_by_a_reclaim_reaches_a_busy_dispatcher(broker_stub, gateway):
    """W1 (max_in_flight 1) holds a lease it never acks while W2 acks every 200 ms with
    40 tasks waiting: once the reaper takes W1's lease away (visibility timeout 2 s), W1
    gets work again at once, not after the load (the wake-ups of W2's acks used to keep
    the periodic re-check from ever running, and the reclaim freed no credit)."""
    # W1 heartbeats without naming the lease it holds, so stream health would end its
    # stream as not reading (test_stream_health.py); this test is about the reaper
    gateway.dispatcher.health.stall_after_s = float("inf")
    w1 = await LeaseStream(broker_stub, "w1", ["q"], max_in_flight=1).open()
    await broker_stub.Enqueue(enq())
    held = await w1.next()
    w2 = await LeaseStream(broker_stub, "w2", ["q"], max_in_flight=1).open()
    await broker_stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[enq() for _ in range(40)]))
    stop = asyncio.Event()
    load = asyncio.create_task(_ack_slowly(broker_stub, w2, 0.2, stop))
    t0 = asyncio.get_running_loop().time()
    nxt = await w1.next(timeout_s=6)  # VT 2 s + reaper interval 0.5 s + the read
    waited = asyncio.get_running_loop().time() - t0
    stop.set()
    await load
    assert nxt.task_id != held.task_id or nxt.attempt == 2
    assert waited < 4.0, f"W1 waited {waited:.1f} s after its lease was lost"
    w1.close()
    w2.close()


async def test_a_worker_that_resumes_heartbeats_gets_work_at_once(broker_stub):
    """W1 skips heartbeats past the stale limit (2 intervals = 1 s) while W2 acks every
    200 ms: its first heartbeat after that makes it eligible at once."""
    w1 = await LeaseStream(broker_stub, "w1", ["q"], max_in_flight=4, heartbeat=False).open()
    w2 = await LeaseStream(broker_stub, "w2", ["q"], max_in_flight=1).open()
    await asyncio.sleep(1.5)  # the scenario: W1 is silent past the stale limit
    await broker_stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[enq() for _ in range(40)]))
    stop = asyncio.Event()
    load = asyncio.create_task(_ack_slowly(broker_stub, w2, 0.2, stop))
    with pytest.raises(asyncio.TimeoutError):
        await w1.next(timeout_s=0.5)  # stalled: nothing while it is silent
    await broker_stub.Heartbeat(pb.HeartbeatRequest(worker_id="w1"))
    t0 = asyncio.get_running_loop().time()
    await w1.next(timeout_s=5)
    waited = asyncio.get_running_loop().time() - t0
    stop.set()
    await load
    assert waited < 2.0, f"W1 waited {waited:.2f} s after its heartbeat"
    w1.close()
    w2.close()


async def test_requeue_refuses_a_dead_letter_whose_key_a_live_task_holds(broker_stub, channel):
    """Enqueue(K) → dead-lettered T1; Enqueue(K) → T2; RequeueDeadLetter(T1) would make two
    live tasks for one key: refused with FAILED_PRECONDITION naming T2, nothing changed."""
    import grpc

    from dtq_proto import dtq_pb2_grpc
    from tests.support.leasing import error_reason

    admin = dtq_pb2_grpc.AdminStub(channel)
    t1 = await broker_stub.Enqueue(enq(idempotency_key="K", max_attempts=1))
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    task = await lease.next()
    await broker_stub.Fail(pb.FailRequest(items=[pb.FailItem(
        lease_id=task.lease_id, error_message="bad input", retryable=False)]))
    lease.close()
    t2 = await broker_stub.Enqueue(enq(idempotency_key="K", delay_ms=60_000))
    assert not t2.deduplicated and t2.task_id != t1.task_id
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await admin.RequeueDeadLetter(pb.RequeueDeadLetterRequest(task_id=t1.task_id))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(err.value) == "IDEMPOTENCY_KEY_TAKEN"
    assert t2.task_id in err.value.details()
    got = (await broker_stub.GetTask(pb.GetTaskRequest(task_id=t1.task_id))).task
    assert got.status == pb.TASK_STATUS_DEAD_LETTERED


async def test_depth_gate_counts_live_tasks_only(redis_url):
    """DTQ_MAX_QUEUE_DEPTH=20: 20 enqueued then all cancelled leave room for more (the
    cancelled tasks' entries used to count until a worker read them)."""
    import grpc

    from dtq_gateway.server import Gateway
    from dtq_proto import dtq_pb2_grpc
    from tests.conftest import gateway_settings
    from tests.support.leasing import error_reason

    gw = Gateway(gateway_settings(redis_url, max_queue_depth=20), redis_url)
    await gw.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}")
    stub = dtq_pb2_grpc.BrokerStub(channel)
    try:
        resp = await stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[enq() for _ in range(20)]))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Enqueue(enq())
        assert error_reason(err.value) == "QUEUE_FULL"
        for res in resp.results:
            await stub.CancelTask(pb.CancelTaskRequest(task_id=res.task_id))
        after = await stub.Enqueue(enq())
        assert after.status == pb.TASK_STATUS_QUEUED
    finally:
        await channel.close()
        await gw.stop()


async def test_consumers_of_gone_workers_are_deleted(redis_url):
    """Twenty worker ids each lease and ack one task, then go away: their consumers leave
    XINFO CONSUMERS once idle (DTQ_CONSUMER_PRUNE_IDLE_S), while a worker that still
    holds a lease keeps its consumer (deleting it would drop the lease)."""
    import grpc
    import redis.asyncio as aioredis

    from dtq_gateway.server import Gateway
    from dtq_gateway.store import keys
    from dtq_proto import dtq_pb2_grpc
    from tests.conftest import gateway_settings

    gw = Gateway(gateway_settings(redis_url, consumer_prune_idle_s=0.3), redis_url)
    await gw.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}")
    stub = dtq_pb2_grpc.BrokerStub(channel)
    r = aioredis.Redis.from_url(redis_url)

    async def names() -> set[str]:
        got = await r.xinfo_consumers(keys.stream("q", 5), keys.GROUP)
        return {c["name"].decode() if isinstance(c["name"], bytes) else c["name"]
                for c in got} - {keys.REAPER_CONSUMER}

    try:
        for n in range(20):
            await stub.Enqueue(enq())
            lease = await LeaseStream(stub, f"gone-{n}", ["q"], max_in_flight=1).open()
            task = await lease.next()
            # checked while it holds a pending entry, which no prune deletes (the earlier
            # ones may already be pruned: the reaper runs from one visibility timeout on)
            assert f"gone-{n}" in await names()
            await stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=task.lease_id)]))
            lease.close()
        await stub.Enqueue(enq())
        holder = await LeaseStream(stub, "holder", ["q"], max_in_flight=1,
                                   heartbeat=False).open()
        held = await holder.next()  # never acked: its entry stays pending on "holder"
        stop = asyncio.Event()

        async def keep() -> None:  # the holder is alive: it heartbeats its lease
            while not stop.is_set():
                await stub.Heartbeat(pb.HeartbeatRequest(worker_id="holder",
                                                         lease_ids=[held.lease_id]))
                await asyncio.sleep(0.25)  # the worker's heartbeat cadence

        beats = asyncio.create_task(keep())
        assert "holder" in await names()
        assert await poll(names, lambda n: n == {"holder"}, timeout_s=10) == {"holder"}
        stop.set()
        await beats
        holder.close()
    finally:
        await r.aclose()
        await channel.close()
        await gw.stop()


async def test_a_slow_lease_reader_holds_no_backlog(gateway, broker_stub):
    """A Lease with max_in_flight 500 whose client reads one message and stops (its
    HTTP/2 window fills) takes only what its stream can write; the rest goes to a
    working worker at once, no attempt spent (it used to activate everything into the
    gateway's memory, where it expired unread and came back as attempt 2)."""
    import grpc

    from dtq_proto import dtq_pb2_grpc

    slow_channel = grpc.aio.insecure_channel(  # a small, fixed receive window
        f"127.0.0.1:{gateway.port}", options=[("grpc.http2.bdp_probe", 0)])
    slow = dtq_pb2_grpc.BrokerStub(slow_channel)
    await slow.Heartbeat(pb.HeartbeatRequest(worker_id="slow"))
    call = slow.Lease(pb.LeaseRequest(worker_id="slow", queues=["q"], max_in_flight=500))
    await call.read()  # SessionInfo
    big = b'{"pad":"' + b"x" * 4000 + b'"}'
    await broker_stub.EnqueueBatch(pb.EnqueueBatchRequest(
        items=[pb.EnqueueRequest(queue="q", task_type="t", payload=big) for _ in range(300)]))
    await call.read()  # one task, then nothing more is read
    # the scenario: the slow session is alone while the gateway releases what it could
    # not write (after half the visibility timeout); it must not take them back
    await asyncio.sleep(1.5)
    worker = await LeaseStream(broker_stub, "w2", ["q"], max_in_flight=50).open()
    got = []
    try:
        # all but what the stuck stream's transport window already holds (~16 of these),
        # and nothing taken back by the stuck session once released
        while len(got) < 250:
            task = await worker.next(timeout_s=5)
            got.append(task)
            await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=task.lease_id)]))
        assert all(t.attempt == 1 for t in got), "tasks came back as retries"
    finally:
        call.cancel()
        worker.close()
        await slow_channel.close()


async def test_list_workers_shows_whether_a_worker_has_a_lease_stream(broker_stub, channel,
                                                                       redis_url):
    """A worker that heartbeats but has no open Lease stream (it reconnects, or its
    stream's connection died) is alive but not leasing; a gateway that is gone (its
    liveness key expired) counts for no stream."""
    import redis.asyncio as aioredis

    from dtq_gateway.store import keys
    from dtq_proto import dtq_pb2_grpc

    admin = dtq_pb2_grpc.AdminStub(channel)

    async def leasing() -> bool:
        workers = (await admin.ListWorkers(pb.ListWorkersRequest())).workers
        return {w.worker_id: w.leasing for w in workers}.get("w1", False)

    await broker_stub.Heartbeat(pb.HeartbeatRequest(worker_id="w1"))
    assert not await leasing()
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    assert await poll(leasing, lambda v: v)
    r = aioredis.Redis.from_url(redis_url)
    try:
        gone = [k async for k in r.scan_iter(match=keys.gateway("*"))]
        assert len(gone) == 1
        await r.delete(*gone)  # as if its gateway had died: the key is not refreshed...
        await r.hset(keys.worker("w1"), "leasing@" + "f" * 16, 1)  # ...and a stale count
        # the live gateway refreshes its key within a probe interval; the stale count of
        # a gateway without a key never counts
        lease.close()
        assert await poll(leasing, lambda v: not v) is False
    finally:
        await r.aclose()


async def test_a_queued_cancel_emits_one_task_cancelled(broker_stub, channel, gateway):
    """CancelTask of a queued task emits TASK_CANCELLED once (the lease path used to emit
    a second one, stage=dispatch, when it acked the entry away)."""
    from dtq_proto import dtq_pb2_grpc

    events = dtq_pb2_grpc.EventsStub(channel).Subscribe(pb.SubscribeRequest(queues=["q"]))
    # pub/sub keeps no history: the hub listens and the Subscribe call is registered
    # before the first event is published
    await asyncio.wait_for(gateway.ops.hub.connected.wait(), 5)
    await poll(lambda: asyncio.sleep(0, gateway.ops.hub.subscriber_count), lambda n: n >= 1)
    cancelled = await broker_stub.Enqueue(enq())
    await broker_stub.CancelTask(pb.CancelTaskRequest(task_id=cancelled.task_id))
    marker = await broker_stub.Enqueue(enq())  # leased after the cancelled one's entry
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    assert (await lease.next()).task_id == marker.task_id
    seen = []
    async for ev in events:  # events of one queue arrive in order: stop at the marker
        seen.append((ev.type, ev.task_id))
        if ev.type == pb.EVENT_TYPE_TASK_STARTED and ev.task_id == marker.task_id:
            break
    events.cancel()
    lease.close()
    assert seen.count((pb.EVENT_TYPE_TASK_CANCELLED, cancelled.task_id)) == 1


async def test_requeue_takes_the_key_over_from_a_task_that_ended(broker_stub, channel):
    """The key's later holder T2 completed: RequeueDeadLetter(T1) goes through and the key
    names T1 again, so an Enqueue with the key dedupes to the live T1 (it used to keep
    naming T2 and, once T2's window ran out, let a second live task take the key)."""
    from dtq_proto import dtq_pb2_grpc

    admin = dtq_pb2_grpc.AdminStub(channel)
    t1 = await broker_stub.Enqueue(enq(idempotency_key="K2", max_attempts=1))
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    await broker_stub.Fail(pb.FailRequest(items=[pb.FailItem(
        lease_id=(await lease.next()).lease_id, retryable=False)]))
    t2 = await broker_stub.Enqueue(enq(idempotency_key="K2"))
    await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=(await lease.next()).lease_id)]))
    lease.close()
    await admin.PauseQueue(pb.PauseQueueRequest(queue="q"))  # keep T1 queued
    await admin.RequeueDeadLetter(pb.RequeueDeadLetterRequest(task_id=t1.task_id))
    again = await broker_stub.Enqueue(enq(idempotency_key="K2"))
    assert (again.task_id, again.deduplicated) == (t1.task_id, True), (t2.task_id, again)


async def test_a_lease_id_edited_to_another_queue_or_key_is_refused(broker_stub, gateway):
    """Two tasks of one batch in two queues share their entry id: A's lease id edited to
    name B's queue must not ack B's entry; a keyed task's lease id edited to carry no
    digest must not complete it while leaving its idempotency record untouched. Edited
    ids fail their MAC (PERMISSION_DENIED); re-signed with the gateway's own secret (an
    attacker has none) the scripts still fence them as stale."""
    import grpc

    from tests.support.leasing import error_reason, resign

    batch = await broker_stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[
        pb.EnqueueRequest(queue="xa", task_type="t", payload=b"{}", idempotency_key="KA"),
        pb.EnqueueRequest(queue="xb", task_type="t", payload=b"{}")]))
    lease = await LeaseStream(broker_stub, "w1", ["xa", "xb"]).open()
    a, b = sorted(await lease.take(2), key=lambda t: t.queue)
    ring = gateway.keyring
    edits = [{"idem_digest": ""}]
    if a.lease_id.split("|")[4] == b.lease_id.split("|")[4]:  # same entry id: the case
        edits.append({"queue": "xb"})
    for edit in edits:
        edited = "|".join(resign(a.lease_id, ring, **edit).split("|")[:-1]
                          + [a.lease_id.rpartition("|")[2]])  # the edit, original MAC
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=edited)]))
        assert (err.value.code(), error_reason(err.value)) == (
            grpc.StatusCode.PERMISSION_DENIED, "LEASE_SIGNATURE")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(
                lease_id=resign(a.lease_id, ring, **edit))]))
        assert error_reason(err.value) == "STALE_LEASE"
    zero = a.lease_id.split("|")
    zero[5] = "0" + zero[5]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id="|".join(zero))]))
    assert error_reason(err.value) in ("MALFORMED_LEASE", "INVALID_ARGUMENT")
    ok = await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=a.lease_id),
                                                    pb.AckItem(lease_id=b.lease_id)]))
    assert [r.status for r in ok.results] == [pb.TASK_STATUS_SUCCEEDED] * 2
    assert {r.task_id for r in batch.results} == {a.task_id, b.task_id}
    lease.close()
