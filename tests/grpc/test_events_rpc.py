"""dtq.v1.Events/Subscribe through a real gRPC channel."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from dtq_gateway import keys
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
