"""The way out of a full Redis: consuming tasks works while Redis refuses writes.

A real redis-server (the test's own) is filled with queued tasks until ``maxmemory``
(noeviction) refuses Enqueue; then a worker that never connected before opens a Lease,
and leases, acks, fails (retry and dead letter), cancels, resumes, purges and deletes
all work, while Enqueue stays refused with REDIS_OUT_OF_MEMORY and health names the
reason. Once drained (a task retention of 10 s: the finished records expire), Enqueue is
accepted again. Needs Redis >= 7.0 (script flags); on 6.2 it is skipped.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import grpc
import pytest
import redis.asyncio as aioredis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dtq_gateway.server import Gateway
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.conftest import gateway_settings
from tests.support.leasing import LeaseStream, error_reason, poll

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

PAYLOAD = b'{"pad":"' + b"x" * 900 + b'"}'
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
DEADLINE_S = 60.0
#: the health service that names the reason Enqueue is refused (docs/operations.md)
ENQUEUE_HEALTH = "dtq.enqueue"


def enq(queue: str = "q") -> pb.EnqueueRequest:
    return pb.EnqueueRequest(queue=queue, task_type="t", payload=PAYLOAD,
                             max_attempts=2)


@pytest.fixture
async def env(own_redis):
    r = aioredis.Redis.from_url(own_redis.url)
    major = int((await r.info("server"))["redis_version"].split(".")[0])
    if major < 7:
        await r.aclose()
        pytest.skip("the way out of a full Redis needs Redis >= 7.0 (script flags)")
    gw = Gateway(gateway_settings(own_redis.url, task_retention_s=10,
                                  backoff_base_ms=10, backoff_cap_ms=50),
                 own_redis.url)
    await gw.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}")
    yield SimpleNamespace(stub=dtq_pb2_grpc.BrokerStub(channel),
                          admin=dtq_pb2_grpc.AdminStub(channel),
                          health=health_pb2_grpc.HealthStub(channel), r=r)
    await r.config_set("maxmemory", 0)
    await channel.close()
    await gw.stop()
    await r.aclose()


async def _fill(env) -> list[str]:
    """Enqueue tasks to ``q`` (100-task batches, then single ones) until Redis refuses
    them for memory; returns the ids of the stored ones."""
    # one task first: the queue's groups and the scripts are then in Redis, so the cap
    # below counts tasks (a first batch also pays for those, about 600 KB)
    stored = [(await env.stub.Enqueue(enq())).task_id]
    used = int((await env.r.info("memory"))["used_memory"])
    await env.r.config_set("maxmemory", used + 600_000)
    while True:
        try:
            resp = await env.stub.EnqueueBatch(pb.EnqueueBatchRequest(
                items=[enq() for _ in range(100)]))
        except grpc.aio.AioRpcError as exc:  # refused whole
            assert error_reason(exc) == "REDIS_OUT_OF_MEMORY"
            break
        stored += [res.task_id for res in resp.results if res.task_id]
        refused = [res.error for res in resp.results if not res.task_id]
        if refused:
            assert {e.reason for e in refused} == {"REDIS_OUT_OF_MEMORY"}
            break
    # a refused chunk may leave a little room: single tasks until one is refused too
    for _ in range(1000):
        try:
            stored.append((await env.stub.Enqueue(enq())).task_id)
        except grpc.aio.AioRpcError as exc:
            assert error_reason(exc) == "REDIS_OUT_OF_MEMORY"
            return stored
    raise AssertionError("Redis never refused a task")


async def _enqueue_refused(env) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.stub.Enqueue(enq())
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error_reason(err.value) == "REDIS_OUT_OF_MEMORY"


async def _health(env, service: str = "") -> int:
    return (await env.health.Check(health_pb2.HealthCheckRequest(service=service))).status


async def test_a_new_worker_drains_a_full_redis_and_admin_calls_work(env):
    stub, admin = env.stub, env.admin
    # before the fill: a paused queue, a dead letter and a queued task to cancel
    await admin.PauseQueue(pb.PauseQueueRequest(queue="paused", create=True))
    await stub.Enqueue(pb.EnqueueRequest(queue="d", task_type="t", payload=b"{}"))
    doomed = await stub.Enqueue(pb.EnqueueRequest(queue="c", task_type="t", payload=b"{}"))
    worker = await LeaseStream(stub, "old", ["d"], max_in_flight=1).open()
    t = await worker.next(10)
    await stub.Fail(pb.FailRequest(items=[pb.FailItem(lease_id=t.lease_id,
                                                      retryable=False)]))
    worker.close()
    stored = await _fill(env)
    assert len(stored) >= 100
    # pinned below what is used, so the drain's first freed bytes (stream entries, a
    # batch's query buffer) do not end the test's full state; the finished records
    # (about 1 KB each) free far more once they expire
    used = int((await env.r.info("memory"))["used_memory"])
    await env.r.config_set("maxmemory", used - 100_000)
    await _enqueue_refused(env)

    # the admin way out
    assert (await admin.ResumeQueue(pb.ResumeQueueRequest(queue="paused"))).changed
    assert (await admin.PauseQueue(pb.PauseQueueRequest(queue="q"))).changed
    assert (await admin.ResumeQueue(pb.ResumeQueueRequest(queue="q"))).changed
    cancel = await stub.CancelTask(pb.CancelTaskRequest(task_id=doomed.task_id))
    assert cancel.status == pb.TASK_STATUS_CANCELLED
    assert (await admin.PurgeDeadLetters(pb.PurgeDeadLettersRequest())).purged == 1
    assert (await admin.DeleteQueue(pb.DeleteQueueRequest(queue="c"))).deleted
    await _enqueue_refused(env)

    # a worker that stopped without a word holds 3 leases: they expire and are reclaimed
    stalled = await LeaseStream(stub, "stalled", ["q"], max_in_flight=3,
                                heartbeat=False).open()
    reclaimed = {t.task_id for t in await stalled.take(3, DEADLINE_S)}
    # a worker never seen before joins and drains q: ack most, fail some (a retry
    # that is acked next time, and dead letters)
    new = await LeaseStream(stub, "newcomer", ["q"], max_in_flight=50).open()
    await stub.Heartbeat(pb.HeartbeatRequest(worker_id="newcomer"))
    attempts: dict[str, int] = {}
    pending = set(stored)
    failed_once: set[str] = set()
    dead_lettered: set[str] = set()
    final: dict[str, int] = {}
    while pending:
        task = await new.next(DEADLINE_S)
        attempts[task.task_id] = task.attempt
        if task.task_id in pending and len(failed_once) < 10 and task.attempt == 1:
            failed_once.add(task.task_id)
            res = await stub.Fail(pb.FailRequest(items=[pb.FailItem(lease_id=task.lease_id)]))
        elif task.task_id in pending and len(dead_lettered) < 5 and task.attempt == 1:
            dead_lettered.add(task.task_id)
            pending.discard(task.task_id)
            res = await stub.Fail(pb.FailRequest(items=[pb.FailItem(
                lease_id=task.lease_id, retryable=False)]))
            if len(dead_lettered) == 1:
                await admin.DiscardDeadLetter(pb.DiscardDeadLetterRequest(
                    task_id=task.task_id))
        else:
            pending.discard(task.task_id)
            res = await stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=task.lease_id)]))
        assert not res.results[0].HasField("error"), res.results[0].error
        final[task.task_id] = res.results[0].status
    new.close()
    stalled.close()
    # what the way out added past maxmemory (attempt outcomes in the records, dead
    # letters, audit, the workers): under 2 KB a task (measured: about 0.8 KB)
    grown = int((await env.r.info("memory"))["used_memory"]) - used
    assert grown < 2_000 * len(stored), grown
    assert {attempts[t] for t in reclaimed} == {2}  # reclaimed, then acked
    # every task terminal, none lost (the records expire 10 s after they end, so the
    # status is the one Ack / Fail answered)
    assert set(final) == set(stored)
    assert {t for t, s in final.items() if s == pb.TASK_STATUS_DEAD_LETTERED} == dead_lettered
    assert {t for t, s in final.items() if s == pb.TASK_STATUS_SUCCEEDED} \
        == set(stored) - dead_lettered
    assert len(failed_once) == 10 and not failed_once & dead_lettered  # retried, acked

    # the dead letters of the drain, less the one discarded
    purged = await admin.PurgeDeadLetters(pb.PurgeDeadLettersRequest())
    assert purged.purged == len(dead_lettered) - 1

    # drained: the finished records expire (retention 10 s) and Enqueue is taken again
    async def try_enqueue() -> bool:
        try:
            await stub.Enqueue(enq("after"))
            return True
        except grpc.aio.AioRpcError as exc:
            assert error_reason(exc) == "REDIS_OUT_OF_MEMORY"
            await asyncio.sleep(0.2)
            return False

    assert await poll(try_enqueue, bool, timeout_s=DEADLINE_S)


async def test_health_names_a_full_redis_and_stays_serving(env):
    assert await poll(lambda: _health(env, ENQUEUE_HEALTH), lambda s: s == SERVING,
                      timeout_s=DEADLINE_S)
    await _fill(env)
    # well below what is used: full whatever Redis frees meanwhile (a batch's ~100 KB
    # query buffer)
    used = int((await env.r.info("memory"))["used_memory"])
    await env.r.config_set("maxmemory", used - 300_000)
    await _enqueue_refused(env)
    assert await poll(lambda: _health(env, ENQUEUE_HEALTH), lambda s: s == NOT_SERVING,
                      timeout_s=DEADLINE_S)
    for service in ("", "dtq.v1.Broker", "dtq.v1.Admin"):  # the way out stays reachable
        assert await _health(env, service) == SERVING
    await env.r.config_set("maxmemory", 0)
    assert await poll(lambda: _health(env, ENQUEUE_HEALTH), lambda s: s == SERVING,
                      timeout_s=DEADLINE_S)


async def test_a_gateway_started_while_redis_is_full_serves_the_way_out(env, own_redis):
    """A replica (re)started while Redis is full loads the stored lease secret (a read)
    and leases to a new worker."""
    stored = await _fill(env)
    assert len(stored) >= 100
    used = int((await env.r.info("memory"))["used_memory"])
    await env.r.config_set("maxmemory", used - 100_000)
    await _enqueue_refused(env)
    late = Gateway(gateway_settings(own_redis.url), own_redis.url)
    await late.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{late.port}")
    try:
        stub = dtq_pb2_grpc.BrokerStub(channel)
        worker = await LeaseStream(stub, "late-comer", ["q"], max_in_flight=1).open()
        task = await worker.next(DEADLINE_S)
        assert task.task_id in stored
        res = await stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=task.lease_id)]))
        assert res.results[0].status == pb.TASK_STATUS_SUCCEEDED
        worker.close()
    finally:
        await channel.close()
        await late.stop()
