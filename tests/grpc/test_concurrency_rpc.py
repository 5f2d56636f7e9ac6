"""Per-key concurrency through dtq.v1.Admin, Enqueue and Lease on an in-process gateway
and real Redis (docs/fairness.md).

A task whose concurrency key is at its queue's limit waits (parked, still queued)
without holding back other keys' tasks; every lease end frees the slot and gives one
parked task of the key its turn; nothing of a key is left in Redis once its tasks are
done.
"""

from __future__ import annotations

import grpc
import pytest

from dtq_gateway.store import keys
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.conftest import gateway_settings
from tests.support.leasing import LeaseStream, error_field, poll

Q = "ck"


@pytest.fixture
async def gateway(redis_url):
    """The in-process gateway without stream-stall detection: these tests hold leases
    for seconds on purpose while their LeaseStream heartbeats without lease ids."""
    from dtq_gateway.server import Gateway

    gw = Gateway(gateway_settings(redis_url, lease_stall_heartbeats=0), redis_url)
    await gw.start()
    yield gw
    await gw.stop()


@pytest.fixture
def admin(channel):
    return dtq_pb2_grpc.AdminStub(channel)


async def set_limit(admin, n: int) -> bool:
    return (await admin.SetConcurrencyLimit(pb.SetConcurrencyLimitRequest(
        queue=Q, max_active_per_key=n))).created


async def enqueue(broker_stub, ckeys: list[str]) -> list[str]:
    reply = await broker_stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[
        pb.EnqueueRequest(queue=Q, task_type="t", payload=b"{}", concurrency_key=k)
        for k in ckeys]))
    return [r.task_id for r in reply.results]


async def key_stats(admin) -> dict[str, tuple[int, int]]:
    reply = await admin.GetConcurrency(pb.GetConcurrencyRequest(queue=Q))
    return {k.key: (k.active, k.waiting) for k in reply.keys}


async def ack(broker_stub, *tasks: pb.LeasedTask) -> None:
    await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=t.lease_id)
                                               for t in tasks]))


async def no_more(stream: LeaseStream, timeout_s: float = 0.5) -> bool:
    try:
        await stream.next(timeout_s)
    except TimeoutError:
        return True
    return False


async def test_set_get_list_delete(admin, gateway) -> None:
    assert await set_limit(admin, 3)
    assert not await set_limit(admin, 2)
    got = await admin.GetConcurrency(pb.GetConcurrencyRequest(queue=Q))
    assert (got.max_active_per_key, got.key_count, list(got.keys)) == (2, 0, [])
    listed = (await admin.ListConcurrencyLimits(pb.ListConcurrencyLimitsRequest())).limits
    assert [(x.queue, x.max_active_per_key) for x in listed] == [(Q, 2)]
    assert (await admin.DeleteConcurrencyLimit(pb.DeleteConcurrencyLimitRequest(queue=Q))).deleted
    assert not (await admin.DeleteConcurrencyLimit(
        pb.DeleteConcurrencyLimitRequest(queue=Q))).deleted
    assert not (await admin.ListConcurrencyLimits(pb.ListConcurrencyLimitsRequest())).limits
    assert not await gateway.redis.exists(keys.concurrency_limit(Q),
                                          keys.CONCURRENCY_LIMITED_QUEUES)


@pytest.mark.parametrize("queue, n, field", [
    ("bad queue", 1, "queue"), (Q, 0, "max_active_per_key"),
    (Q, 1_000_001, "max_active_per_key")])
async def test_bad_limit_names_the_field(admin, gateway, queue, n, field) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await admin.SetConcurrencyLimit(pb.SetConcurrencyLimitRequest(
            queue=queue, max_active_per_key=n))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_field(err.value) == field
    assert not await gateway.redis.exists(keys.CONCURRENCY_LIMITED_QUEUES)


@pytest.mark.parametrize("ckey", ["k" * 129, "a\nb", "é" * 65, "a\x7fb", "a\u0085b"])
async def test_bad_concurrency_key_names_the_field(broker_stub, gateway, ckey) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await broker_stub.Enqueue(pb.EnqueueRequest(queue=Q, task_type="t",
                                                    concurrency_key=ckey))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_field(err.value) == "concurrency_key"
    assert not await gateway.redis.keys("dtq:task:*")


async def test_key_at_its_limit_waits_without_blocking_other_keys(
        admin, broker_stub, gateway) -> None:
    await set_limit(admin, 2)
    a_ids = await enqueue(broker_stub, ["a"] * 6)
    b_ids = await enqueue(broker_stub, ["b", "b", ""])
    stream = await LeaseStream(broker_stub, "w1", [Q], max_in_flight=20).open()
    try:
        first = await stream.take(5)
        assert [t.task_id for t in first] == a_ids[:2] + b_ids
        assert await no_more(stream)
        assert await key_stats(admin) == {"a": (2, 4), "b": (2, 0)}
        # parked tasks are out of the band streams: depth counts the 5 leased entries
        stats = await admin.GetQueueStats(pb.GetQueueStatsRequest(queue=Q))
        assert (stats.depth, stats.pending) == (5, 5)
        got = await admin.GetConcurrency(pb.GetConcurrencyRequest(queue=Q))
        assert (got.active, got.waiting, got.key_count) == (4, 4, 2)
        waiting = await broker_stub.GetTask(pb.GetTaskRequest(task_id=a_ids[2]))
        assert (waiting.task.status, waiting.task.parked, waiting.task.concurrency_key) \
            == (pb.TASK_STATUS_QUEUED, True, "a")
        running = await broker_stub.GetTask(pb.GetTaskRequest(task_id=a_ids[0]))
        assert (running.task.parked, running.task.concurrency_key) == (False, "a")
        # each ack of a frees one slot and gives the next parked task of a its turn
        await ack(broker_stub, first[0])
        (third,) = await stream.take(1)
        assert third.task_id == a_ids[2]
        assert await no_more(stream)
        await ack(broker_stub, first[1], third, *first[2:])
        pair = await stream.take(2)  # two slots of a free: two parked tasks went back
        assert sorted(t.task_id for t in pair) == sorted(a_ids[3:5])
        assert await no_more(stream)
        await ack(broker_stub, *pair)
        (last,) = await stream.take(1)
        assert last.task_id == a_ids[5]
        await ack(broker_stub, last)
        # nothing of the keys is left once their tasks are done
        await poll(lambda: key_stats(admin), lambda s: s == {})
        assert not await gateway.redis.keys(f"dtq:conc:{{{Q}}}:parked:*")
        assert not await gateway.redis.exists(keys.concurrency_active(Q),
                                              keys.concurrency_waiting(Q))
    finally:
        stream.close()


async def test_fail_release_and_retry_free_the_slot(admin, broker_stub, gateway) -> None:
    await set_limit(admin, 1)
    ids = await enqueue(broker_stub, ["k"] * 3)
    stream = await LeaseStream(broker_stub, "w1", [Q], max_in_flight=10).open()
    try:
        (t1,) = await stream.take(1)
        assert await no_more(stream)
        await broker_stub.Fail(pb.FailRequest(items=[pb.FailItem(
            lease_id=t1.lease_id, mode=pb.FAIL_MODE_RELEASE)]))
        (t2,) = await stream.take(1)
        assert t2.task_id == ids[1]  # the parked one went back first, t1 after it
        await broker_stub.Fail(pb.FailRequest(items=[pb.FailItem(
            lease_id=t2.lease_id, error_message="x", retryable=False)]))
        # parked in turn: ids[2] first, then the released ids[0] (parked behind it)
        (t3,) = await stream.take(1)
        assert t3.task_id == ids[2]
        assert await key_stats(admin) == {"k": (1, 1)}
        await ack(broker_stub, t3)
        (t4,) = await stream.take(1)
        assert (t4.task_id, t4.attempt) == (ids[0], 1)  # a release spends no attempt
        await ack(broker_stub, t4)
        await poll(lambda: key_stats(admin), lambda s: s == {})
    finally:
        stream.close()


async def test_cancel_of_a_parked_task_takes_it_out(admin, broker_stub, gateway) -> None:
    await set_limit(admin, 1)
    ids = await enqueue(broker_stub, ["k"] * 3)
    stream = await LeaseStream(broker_stub, "w1", [Q], max_in_flight=10).open()
    try:
        (t1,) = await stream.take(1)
        await poll(lambda: key_stats(admin), lambda s: s == {"k": (1, 2)})
        await broker_stub.CancelTask(pb.CancelTaskRequest(task_id=ids[1]))
        assert await key_stats(admin) == {"k": (1, 1)}
        await ack(broker_stub, t1)
        (t3,) = await stream.take(1)
        assert t3.task_id == ids[2]
        await ack(broker_stub, t3)
        await poll(lambda: key_stats(admin), lambda s: s == {})
    finally:
        stream.close()


async def test_raising_or_deleting_the_limit_lets_parked_tasks_go(
        admin, broker_stub, gateway) -> None:
    await set_limit(admin, 1)
    await enqueue(broker_stub, ["k"] * 5)
    stream = await LeaseStream(broker_stub, "w1", [Q], max_in_flight=10).open()
    try:
        held = await stream.take(1)
        await poll(lambda: key_stats(admin), lambda s: s == {"k": (1, 4)})
        await set_limit(admin, 3)
        held += await stream.take(2)
        assert await no_more(stream)
        await admin.DeleteConcurrencyLimit(pb.DeleteConcurrencyLimitRequest(queue=Q))
        held += await stream.take(2)
        assert await key_stats(admin) == {"k": (5, 0)}
        await ack(broker_stub, *held)
        await poll(lambda: key_stats(admin), lambda s: s == {})
    finally:
        stream.close()


async def test_lost_lease_frees_the_slot_after_reclaim(admin, broker_stub, gateway) -> None:
    """A worker that vanishes mid-task (no ack, no heartbeat) holds the key's slot only
    until the reaper reclaims its lease (DTQ_VISIBILITY_TIMEOUT_S=2 in tests)."""
    await set_limit(admin, 1)
    ids = await enqueue(broker_stub, ["k", "k"])
    dead = await LeaseStream(broker_stub, "dead", [Q], max_in_flight=1,
                             heartbeat=False).open()
    (lost,) = await dead.take(1)
    assert lost.task_id == ids[0]
    dead.close()
    stream = await LeaseStream(broker_stub, "w2", [Q], max_in_flight=10).open()
    try:
        (one,) = await stream.take(1, timeout_s=15)  # after the reclaim: the slot is free
        assert await key_stats(admin) == {"k": (1, 1)}
        assert await no_more(stream)
        await ack(broker_stub, one)
        (two,) = await stream.take(1)
        assert {one.task_id, two.task_id} == set(ids)
        retried = one if one.task_id == ids[0] else two
        assert retried.attempt == 2
        await ack(broker_stub, two)
        await poll(lambda: key_stats(admin), lambda s: s == {})
    finally:
        stream.close()


def gauge(name: str, **labels: str) -> float | None:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels)


async def test_gauges_show_the_busiest_keys_only(admin, broker_stub, gateway) -> None:
    """12 keys with one active and one parked task each: dtq_concurrency_keys counts 12,
    the per-key series exist for 10 keys; once every task is done no series is left."""
    from dtq_gateway.duties.concurrency_gauges import ConcurrencyGauges

    await set_limit(admin, 1)
    names = [f"k{i:02d}" for i in range(12)]
    await enqueue(broker_stub, names + names)
    stream = await LeaseStream(broker_stub, "w1", [Q], max_in_flight=30).open()
    gauges = ConcurrencyGauges()
    try:
        first = await stream.take(12)
        await poll(lambda: admin.GetConcurrency(pb.GetConcurrencyRequest(queue=Q)),
                   lambda c: (c.active, c.waiting, c.key_count) == (12, 12, 12))
        await gauges.refresh(gateway.redis, [Q])
        assert gauge("dtq_concurrency_keys", queue=Q) == 12
        assert gauge("dtq_concurrency_waiting_total", queue=Q) == 12
        shown = [k for k in names if gauge("dtq_concurrency_active", queue=Q, key=k)]
        assert shown == names[:10]  # ties ranked by key
        assert gauge("dtq_concurrency_waiting", queue=Q, key="k00") == 1
        await ack(broker_stub, *first)
        await ack(broker_stub, *await stream.take(12))
        await poll(lambda: key_stats(admin), lambda s: s == {})
        await gauges.refresh(gateway.redis, [Q])
        assert gauge("dtq_concurrency_keys", queue=Q) is None
        assert gauge("dtq_concurrency_active", queue=Q, key="k00") is None
    finally:
        stream.close()


async def test_cancel_of_a_waiting_task_in_its_band_lets_a_parked_one_go(
        admin, broker_stub, gateway) -> None:
    """With no task of the key active, a task of the key that was back in its band is
    cancelled: a parked task of the key takes its place, rather than waiting for a lease
    end that will not come."""
    await set_limit(admin, 1)
    a, b, c = await enqueue(broker_stub, ["k"] * 3)
    w1 = await LeaseStream(broker_stub, "w1", [Q], max_in_flight=3).open()
    (first,) = await w1.take(1)  # b and c were read with it, and parked
    assert first.task_id == a
    await poll(lambda: key_stats(admin), lambda s: s == {"k": (1, 2)})
    w1.close()

    async def sessions() -> int:
        return len(gateway.dispatcher.sessions)

    await poll(sessions, lambda n: n == 0)  # nobody reads the queue from here on
    try:
        await ack(broker_stub, first)
    except grpc.aio.AioRpcError:
        pass  # the closed stream's lease was released already: the slot is free either way
    # b went back to its band (no worker reads now), c is still parked
    await poll(lambda: key_stats(admin), lambda s: s == {"k": (0, 1)})
    for task_id in (a, b):  # a too when its lease was released rather than acked
        got = await broker_stub.GetTask(pb.GetTaskRequest(task_id=task_id))
        if got.task.status == pb.TASK_STATUS_QUEUED:
            await broker_stub.CancelTask(pb.CancelTaskRequest(task_id=task_id))
    assert await key_stats(admin) == {}
    w2 = await LeaseStream(broker_stub, "w2", [Q], max_in_flight=1).open()
    try:
        (got,) = await w2.take(1)
        assert got.task_id == c
        await ack(broker_stub, got)
    finally:
        w2.close()


async def test_delete_queue_removes_its_concurrency_limit(admin, broker_stub, gateway) -> None:
    """A drained queue's per-key limit and counts go with DeleteQueue."""
    await set_limit(admin, 1)
    await enqueue(broker_stub, ["k"])
    stream = await LeaseStream(broker_stub, "w1", [Q], max_in_flight=1).open()
    try:
        await ack(broker_stub, *await stream.take(1))
    finally:
        stream.close()
    await poll(lambda: key_stats(admin), lambda s: s == {})
    # tasks parked under a key count as queued: the queue is not drained
    await gateway.redis.hset(keys.concurrency_waiting(Q), "k", 2)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await admin.DeleteQueue(pb.DeleteQueueRequest(queue=Q))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    await gateway.redis.delete(keys.concurrency_waiting(Q))
    reply = await admin.DeleteQueue(pb.DeleteQueueRequest(queue=Q))
    assert reply.deleted
    assert not await gateway.redis.exists(keys.concurrency_limit(Q))
    assert not await gateway.redis.sismember(keys.CONCURRENCY_LIMITED_QUEUES, Q)
    got = await admin.GetConcurrency(pb.GetConcurrencyRequest(queue=Q))
    assert got.max_active_per_key == 0


async def test_bulk_cancel_reaches_parked_tasks(admin, broker_stub, gateway) -> None:
    """CancelTasks (and PurgeQueue, the same bulk cancel) counts and cancels tasks
    parked under a concurrency key, though they are out of their band."""
    await set_limit(admin, 1)
    ids = await enqueue(broker_stub, ["k"] * 3)
    stream = await LeaseStream(broker_stub, "w1", [Q], max_in_flight=3).open()
    try:
        (running,) = await stream.take(1)
        await poll(lambda: key_stats(admin), lambda s: s == {"k": (1, 2)})
        flt = pb.TaskFilter(queue=Q)
        dry = await admin.CancelTasks(pb.CancelTasksRequest(filter=flt, dry_run=True))
        assert (dry.matched, dry.cancelled) == (2, 0)
        done = await admin.CancelTasks(pb.CancelTasksRequest(filter=flt))
        assert (done.matched, done.cancelled) == (2, 2)
        assert sorted(done.task_ids) == sorted(ids[1:])
        assert await key_stats(admin) == {"k": (1, 0)}
        await ack(broker_stub, running)
        assert await no_more(stream)
        await poll(lambda: key_stats(admin), lambda s: s == {})
    finally:
        stream.close()


async def test_a_parked_task_expires_on_time(admin, broker_stub, gateway) -> None:
    """A parked task whose ttl passes before it starts expires like any waiting task and
    leaves its key's parked list."""
    await set_limit(admin, 1)
    (a,) = await enqueue(broker_stub, ["k"])
    b = (await broker_stub.Enqueue(pb.EnqueueRequest(
        queue=Q, task_type="t", payload=b"{}", concurrency_key="k", ttl_ms=500))).task_id
    stream = await LeaseStream(broker_stub, "w1", [Q], max_in_flight=2).open()
    try:
        (running,) = await stream.take(1)
        assert running.task_id == a
        await poll(lambda: key_stats(admin), lambda s: s == {"k": (1, 1)})  # b parked

        async def status() -> int:
            return (await broker_stub.GetTask(pb.GetTaskRequest(task_id=b))).task.status

        await poll(status, lambda s: s == pb.TASK_STATUS_EXPIRED)
        assert await key_stats(admin) == {"k": (1, 0)}
        assert not await gateway.redis.exists(keys.concurrency_parked(Q, "k"))
        await ack(broker_stub, running)
    finally:
        stream.close()


async def test_purge_reaches_tasks_a_band_cancel_moves_back(admin, broker_stub, gateway) -> None:
    """PurgeQueue cancels every waiting task of a key, also the parked ones that the
    cancel of the key's band tasks moves back to the band while the purge runs."""
    await set_limit(admin, 1)
    ids = await enqueue(broker_stub, ["k"] * 3)
    stream = await LeaseStream(broker_stub, "w1", [Q], max_in_flight=3).open()
    try:
        (t1,) = await stream.take(1)
        await poll(lambda: key_stats(admin), lambda s: s == {"k": (1, 2)})
        await admin.PauseQueue(pb.PauseQueueRequest(queue=Q))
        await broker_stub.Fail(pb.FailRequest(items=[pb.FailItem(
            lease_id=t1.lease_id, mode=pb.FAIL_MODE_RELEASE)]))
        # t1 and one parked task wait in the band, the third one parked
        await poll(lambda: key_stats(admin), lambda s: s == {"k": (0, 1)})
        done = await admin.PurgeQueue(pb.PurgeQueueRequest(queue=Q))
        assert (done.matched, done.cancelled) == (3, 3)
        got = [(await broker_stub.GetTask(pb.GetTaskRequest(task_id=i))).task.status
               for i in ids]
        assert got == [pb.TASK_STATUS_CANCELLED] * 3
        assert await key_stats(admin) == {}
    finally:
        stream.close()
