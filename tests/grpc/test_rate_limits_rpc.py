"""Rate limits through dtq.v1.Admin and Lease on an in-process gateway and real Redis.

A throttled task must wait in its queue: not leased, not failed, no attempt spent.
Lease times are Redis TIME (``leased_at_ms``), so the pacing checks do not depend on
this process's scheduling.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from dtq_gateway import metrics
from dtq_gateway.store import keys
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.support.leasing import LeaseStream, error_field

Q = "rl"


@pytest.fixture
def admin(channel):
    return dtq_pb2_grpc.AdminStub(channel)


async def set_limit(admin, limit: int, period_ms: int = 1000, burst: int = 0,
                    task_type: str = "") -> bool:
    reply = await admin.SetRateLimit(pb.SetRateLimitRequest(rate_limit=pb.RateLimit(
        queue=Q, task_type=task_type, limit=limit, period_ms=period_ms, burst=burst)))
    return reply.created


async def enqueue(broker_stub, n: int, task_type: str = "work") -> list[str]:
    reply = await broker_stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[
        pb.EnqueueRequest(queue=Q, task_type=task_type, payload=b"{}") for _ in range(n)]))
    return [r.task_id for r in reply.results]


async def drain(broker_stub, stream: LeaseStream, n: int, timeout_s: float
                ) -> list[pb.LeasedTask]:
    """Ack leases as they come until ``n`` arrived or ``timeout_s`` passed."""
    got: list[pb.LeasedTask] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while len(got) < n and loop.time() < deadline:
        try:
            t = await stream.next(max(0.01, deadline - loop.time()))
        except TimeoutError:
            break
        got.append(t)
        await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=t.lease_id)]))
    return got


def throttled(scope: str) -> float:
    counter = metrics.RATE_LIMITED_READS if scope == "queue" else metrics.RATE_LIMITED_TASKS
    return counter.labels(Q)._value.get()


async def test_set_change_list_delete(admin, gateway) -> None:
    assert await set_limit(admin, 5)
    assert not await set_limit(admin, 10, period_ms=2000, burst=3)
    assert await set_limit(admin, 2, task_type="email.send")
    listed = (await admin.ListRateLimits(pb.ListRateLimitsRequest(queue=Q))).rate_limits
    assert [(r.task_type, r.limit, r.period_ms, r.burst) for r in listed] == \
        [("", 10, 2000, 3), ("email.send", 2, 1000, 2)]
    assert 0 <= listed[0].tokens <= 3
    assert len((await admin.ListRateLimits(pb.ListRateLimitsRequest())).rate_limits) == 2
    assert (await admin.DeleteRateLimit(pb.DeleteRateLimitRequest(queue=Q))).deleted
    assert not (await admin.DeleteRateLimit(pb.DeleteRateLimitRequest(queue=Q))).deleted
    assert (await admin.DeleteRateLimit(pb.DeleteRateLimitRequest(
        queue=Q, task_type="email.send"))).deleted
    assert not (await admin.ListRateLimits(pb.ListRateLimitsRequest())).rate_limits
    assert not await gateway.redis.exists(keys.rate_limit(Q), keys.RATE_LIMITED_QUEUES)


@pytest.mark.parametrize("rate_limit, field", [
    (pb.RateLimit(queue=Q, limit=0), "rate_limit.limit"),
    (pb.RateLimit(queue="no spaces", limit=1), "rate_limit.queue"),
    (pb.RateLimit(queue=Q, task_type="a b", limit=1), "rate_limit.task_type"),
    (pb.RateLimit(queue=Q, limit=1, period_ms=86_400_001), "rate_limit.period_ms"),
])
async def test_bad_limits_name_their_field(admin, gateway, rate_limit, field) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await admin.SetRateLimit(pb.SetRateLimitRequest(rate_limit=rate_limit))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_field(err.value) == field
    assert not await gateway.redis.exists(keys.rate_limit(Q))


async def test_queue_limit_paces_leases_and_spends_no_attempt(admin, broker_stub) -> None:
    await set_limit(admin, 4, burst=4)  # 4 per second, 4 at once
    ids = await enqueue(broker_stub, 12)
    before = throttled("queue")
    stream = await LeaseStream(broker_stub, "w-rl", [Q], max_in_flight=50).open()
    try:
        first = await drain(broker_stub, stream, 5, timeout_s=5)
        waiting = [t for t in ids if t not in {x.task_id for x in first}]
        task = (await broker_stub.GetTask(pb.GetTaskRequest(task_id=waiting[-1]))).task
        assert (task.status, task.attempt) == (pb.TASK_STATUS_QUEUED, 1)
        rest = await drain(broker_stub, stream, 7, timeout_s=5)
    finally:
        stream.close()
    leased = sorted(t.leased_at_ms for t in first + rest)
    assert len(leased) == 12
    # after the burst of 4, one lease per 250 ms: the 12th at least 1.75 s after the 1st
    assert leased[11] - leased[0] >= 1750, leased
    assert leased[4] - leased[0] >= 200, leased
    assert throttled("queue") > before
    for tid in ids:
        task = (await broker_stub.GetTask(pb.GetTaskRequest(task_id=tid))).task
        assert task.status == pb.TASK_STATUS_SUCCEEDED and len(task.attempts) == 1


async def test_a_throttled_type_does_not_hold_back_other_types(admin, broker_stub) -> None:
    await set_limit(admin, 1, period_ms=10_000, burst=1, task_type="slow")
    slow = await enqueue(broker_stub, 6, "slow")
    fast = await enqueue(broker_stub, 4, "fast")
    before = throttled("task_type")
    stream = await LeaseStream(broker_stub, "w-types", [Q], max_in_flight=3).open()
    try:
        got = await drain(broker_stub, stream, 5, timeout_s=5)
    finally:
        stream.close()
    assert sorted(t.task_type for t in got) == ["fast"] * 4 + ["slow"]
    assert throttled("task_type") > before
    for tid in slow:
        task = (await broker_stub.GetTask(pb.GetTaskRequest(task_id=tid))).task
        assert task.attempt == 1 and task.status in (pb.TASK_STATUS_QUEUED,
                                                     pb.TASK_STATUS_SUCCEEDED)
    assert {t.task_id for t in got} >= set(fast)


async def test_a_limit_changed_at_run_time_applies_at_once(admin, broker_stub) -> None:
    await set_limit(admin, 1, period_ms=60_000, burst=1)
    await enqueue(broker_stub, 5)
    stream = await LeaseStream(broker_stub, "w-change", [Q], max_in_flight=10).open()
    try:
        assert len(await drain(broker_stub, stream, 1, timeout_s=5)) == 1  # the burst of 1
        # then nothing: the next token is a minute away (a slow machine only waits longer)
        assert await drain(broker_stub, stream, 1, timeout_s=1.0) == []
        await set_limit(admin, 1000)  # the other gateways' dispatchers hear of it too
        assert len(await drain(broker_stub, stream, 4, timeout_s=10)) == 4  # not in minutes
    finally:
        stream.close()


async def _set(admin, queue: str, task_type: str = "", limit: int = 5) -> bool:
    reply = await admin.SetRateLimit(pb.SetRateLimitRequest(rate_limit=pb.RateLimit(
        queue=queue, task_type=task_type, limit=limit)))
    return reply.created


async def test_rate_limits_are_capped_by_max_rate_limits(redis_url) -> None:
    """DTQ_MAX_RATE_LIMITS: a new limit beyond it is RESOURCE_EXHAUSTED
    (TOO_MANY_RATE_LIMITS), stores nothing and is counted; changing one still works."""
    from prometheus_client import REGISTRY

    from dtq_gateway.server import Gateway
    from tests.conftest import gateway_settings
    from tests.support.leasing import error_reason

    def refused() -> float:
        return REGISTRY.get_sample_value("dtq_limit_refusals_total",
                                         {"limit": "max_rate_limits"}) or 0.0

    gw = Gateway(gateway_settings(redis_url, max_rate_limits=2), redis_url)
    await gw.start()
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}")
    admin = dtq_pb2_grpc.AdminStub(ch)
    try:
        assert await _set(admin, "a") and await _set(admin, "a", "t1")
        before = refused()
        for queue, task_type in (("a", "t2"), ("b", "")):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _set(admin, queue, task_type)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert error_reason(err.value) == "TOO_MANY_RATE_LIMITS"
            assert error_field(err.value) == "rate_limit"
        assert refused() == before + 2
        assert not await gw.redis.exists(keys.rate_limit("b"))
        assert not await gw.redis.hexists(keys.rate_limit("a"), "cfg|t2")
        assert not await _set(admin, "a", "t1", limit=9)  # a change is not a new limit
        listed = (await admin.ListRateLimits(pb.ListRateLimitsRequest())).rate_limits
        assert [(r.queue, r.task_type, r.limit) for r in listed] == [("a", "", 5), ("a", "t1", 9)]
    finally:
        await ch.close()
        await gw.stop()


async def test_list_rate_limits_pages(admin, gateway) -> None:
    """ListRateLimits pages by (queue, queue-wide first, task type), also within one
    queue, reading only the page; a malformed token names page_token."""
    redis = gateway.redis
    for queue, task_type in (("q2", "x"), ("q1", "b"), ("q1", ""), ("q2", ""), ("q1", "a"),
                             ("q10", "")):
        await _set(admin, queue, task_type)

    async def pages(size: int, queue: str = "") -> list[list[tuple[str, str]]]:
        out, token = [], ""
        while True:
            reply = await admin.ListRateLimits(pb.ListRateLimitsRequest(
                queue=queue, page_size=size, page_token=token))
            out.append([(r.queue, r.task_type) for r in reply.rate_limits])
            token = reply.next_page_token
            if not token:
                return out

    assert await pages(2) == [[("q1", ""), ("q1", "a")], [("q1", "b"), ("q10", "")],
                              [("q2", ""), ("q2", "x")]]
    assert await pages(2, "q1") == [[("q1", ""), ("q1", "a")], [("q1", "b")]]
    assert await pages(1000) == [[("q1", ""), ("q1", "a"), ("q1", "b"), ("q10", ""),
                                  ("q2", ""), ("q2", "x")]]
    hmget, hgetall = await _calls(redis, "hmget"), await _calls(redis, "hgetall")
    assert await pages(1, "q2") == [[("q2", "")], [("q2", "x")]]
    assert await _calls(redis, "hmget") == hmget + 2  # one read per listed limit
    assert await _calls(redis, "hgetall") == hgetall
    for token in ("q1", "bad token!", "q1 *"):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await admin.ListRateLimits(pb.ListRateLimitsRequest(
                queue="q2" if token == "q1 *" else "", page_token=token))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_field(err.value) == "page_token"
    # limits stored before the index existed are indexed once, then listed
    await redis.delete(keys.RATE_LIMIT_INDEX, keys.RATE_LIMIT_INDEX_BUILT)
    assert sum(len(p) for p in await pages(4)) == 6
    # deleting a queue takes its limits out of the index
    await admin.DeleteQueue(pb.DeleteQueueRequest(queue="q1"))
    assert await pages(1000) == [[("q10", ""), ("q2", ""), ("q2", "x")]]
    assert await redis.zcard(keys.RATE_LIMIT_INDEX) == 3


async def _calls(redis, command: str) -> int:
    return int((await redis.info("commandstats")).get(f"cmdstat_{command}", {}).get("calls", 0))
