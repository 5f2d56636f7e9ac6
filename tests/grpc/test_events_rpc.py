"""dtq.v1.Events/Subscribe through a real gRPC channel."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from dtq_gateway.store import keys
from dtq_proto import dtq_pb2 as pb
from tests.support.leasing import error_field, error_reason, poll
from tests.support.ops_server import ops_server


@pytest.fixture
async def ops(redis_url: str):
    async with ops_server(redis_url) as srv:
        await asyncio.wait_for(srv.hub.connected.wait(), 5)
        yield srv


def event(type_: str, queue: str = "q1", **extra) -> str:
    return json.dumps({"event_id": "ab" * 16, "ts": "2026-01-01T00:00:00.000Z", "type": type_,
                       "task_id": "cd" * 16, "queue": queue, "task_type": "t.x", "attempt": 2,
                       "worker_id": "w1", **extra})


async def open_stream(ops, request: pb.SubscribeRequest):
    call = ops.events.Subscribe(request)
    await poll(lambda: asyncio.sleep(0, ops.hub.subscriber_count), lambda n: n >= 1)
    return call


async def test_subscribe_converts_events(ops) -> None:
    call = await open_stream(ops, pb.SubscribeRequest())
    await ops.redis.publish(keys.EVENTS_CHANNEL, event(
        "CONFIGURATION_CHANGED", metadata={"paused": "true", "n": 3, "ok": True}))
    msg = await asyncio.wait_for(call.read(), 5)
    assert (msg.type, msg.queue, msg.task_id, msg.attempt, msg.worker_id, msg.dropped) == (
        pb.EVENT_TYPE_CONFIGURATION_CHANGED, "q1", "cd" * 16, 2, "w1", 0)
    assert dict(msg.metadata) == {"paused": "true", "n": "3", "ok": "true"}
    assert (msg.event_id, msg.ts, msg.task_type) == ("ab" * 16, "2026-01-01T00:00:00.000Z", "t.x")
    call.cancel()
    # the server side lets go of the subscription when the client leaves
    await poll(lambda: asyncio.sleep(0, ops.hub.subscriber_count), lambda n: n == 0)


async def test_subscribe_filters_queue_and_type(ops) -> None:
    call = await open_stream(ops, pb.SubscribeRequest(
        queues=["q2"], types=[pb.EVENT_TYPE_TASK_FAILED, pb.EVENT_TYPE_TASK_DEAD_LETTERED]))
    for type_, queue in [("TASK_FAILED", "q1"), ("TASK_QUEUED", "q2"), ("NOT_A_TYPE", "q2"),
                         ("TASK_DEAD_LETTERED", "q2")]:
        await ops.redis.publish(keys.EVENTS_CHANNEL, event(type_, queue))
    msg = await asyncio.wait_for(call.read(), 5)
    assert (msg.type, msg.queue) == (pb.EVENT_TYPE_TASK_DEAD_LETTERED, "q2")
    call.cancel()


@pytest.mark.parametrize("request_,field", [
    (pb.SubscribeRequest(queues=["bad queue"]), "queues"),
    (pb.SubscribeRequest(types=[99]), "types")])
async def test_subscribe_invalid_filter(ops, request_, field) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        async for _ in ops.events.Subscribe(request_):
            pass
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (error_reason(exc.value), error_field(exc.value)) == ("INVALID_FIELD", field)


async def test_stream_ends_unavailable_when_hub_stops(ops) -> None:
    call = await open_stream(ops, pb.SubscribeRequest())
    await ops.hub.stop()
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await asyncio.wait_for(call.read(), 5)
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
    assert error_reason(exc.value) == "DRAINING"


async def test_subscribe_expands_batch_messages(ops) -> None:
    call = await open_stream(ops, pb.SubscribeRequest(types=[pb.EVENT_TYPE_TASK_FAILED]))
    await ops.redis.publish(keys.EVENTS_CHANNEL, json.dumps({
        "ts_ms": 1796062800123, "id_prefix": "ef" * 12, "events": [
            ["TASK_QUEUED", "t1", "q1", "t.x", 1, "", None],
            ["TASK_FAILED", "t1", "q1", "t.x", 1, "w1", {"error": "boom", "retry": True}]]}))
    msg = await asyncio.wait_for(call.read(), 5)
    assert (msg.event_id, msg.ts, msg.type, msg.task_id, msg.attempt, msg.worker_id,
            msg.dropped) == ("ef" * 12 + "00000002", "2026-11-30T18:20:00.123Z",
                             pb.EVENT_TYPE_TASK_FAILED, "t1", 1, "w1", 0)
    assert dict(msg.metadata) == {"error": "boom", "retry": "true"}
    call.cancel()


async def test_events_beyond_the_budget_are_counted_in_dropped(ops) -> None:
    call = await open_stream(ops, pb.SubscribeRequest())
    budget = ops.hub.fanout.budget
    now = [0.0]
    budget.per_s, budget._tokens, budget._at, budget.clock = 2, 2.0, 0.0, lambda: now[0]
    for n in range(5):
        await ops.redis.publish(keys.EVENTS_CHANNEL, event("TASK_QUEUED", task_id=f"t{n}"))
    got = [await asyncio.wait_for(call.read(), 5) for _ in range(2)]
    assert [(m.task_id, m.dropped) for m in got] == [("t0", 0), ("t1", 0)]
    [sub] = [s for group in ops.hub.fanout._groups.values() for s in group.subs]
    await poll(lambda: asyncio.sleep(0, sub.dropped_total), lambda n: n == 3)  # t2..t4 seen
    now[0] = 10.0
    await ops.redis.publish(keys.EVENTS_CHANNEL, event("TASK_QUEUED", task_id="t9"))
    msg = await asyncio.wait_for(call.read(), 5)
    assert (msg.task_id, msg.dropped) == ("t9", 3)
    call.cancel()


async def test_subscribers_over_the_cap_are_refused(redis_url: str) -> None:
    from prometheus_client import REGISTRY

    def refused() -> float:
        return REGISTRY.get_sample_value("dtq_events_subscriptions_refused_total") or 0.0

    async with ops_server(redis_url, max_subscribers=2) as srv:
        calls = [srv.events.Subscribe(pb.SubscribeRequest()) for _ in range(2)]
        await poll(lambda: asyncio.sleep(0, srv.hub.subscriber_count), lambda n: n == 2)
        before = refused()
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            async for _ in srv.events.Subscribe(pb.SubscribeRequest()):
                pass
        assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_reason(exc.value) == "TOO_MANY_SUBSCRIBERS"
        assert "DTQ_EVENTS_MAX_SUBSCRIBERS" in exc.value.details()
        assert refused() - before == 1
        calls[0].cancel()  # a slot frees up
        await poll(lambda: asyncio.sleep(0, srv.hub.subscriber_count), lambda n: n == 1)
        again = await open_stream(srv, pb.SubscribeRequest())
        await poll(lambda: asyncio.sleep(0, srv.hub.subscriber_count), lambda n: n == 2)
        for call in (again, calls[1]):
            call.cancel()
