"""Requests whose bytes do not parse, and user strings cut by bytes, on a real gateway."""

from __future__ import annotations

import grpc
import pytest

from dtq_gateway.server import Gateway
from dtq_proto import dtq_pb2 as pb
from tests.conftest import gateway_settings
from tests.support.leasing import LeaseStream, error_field, error_reason

#: HeartbeatRequest{worker_id: "w44" + 0xff}: field 1, length 4, not valid UTF-8.
BAD_UTF8 = bytes.fromhex("0a04773434ff")
#: Field 1 announces 10 bytes but the message ends after 2: a truncated message.
TRUNCATED = bytes.fromhex("0a0a7734")
METHODS = ["/dtq.v1.Broker/Heartbeat", "/dtq.v1.Broker/Enqueue", "/dtq.v1.Broker/Ack",
           "/dtq.v1.Broker/Fail", "/dtq.v1.Broker/GetTask", "/dtq.v1.Broker/CancelTask",
           "/dtq.v1.Admin/GetQueueStats",
           "/grpc.health.v1.Health/Check"]
STREAMS = ["/dtq.v1.Broker/Lease", "/dtq.v1.Events/Subscribe"]


async def _raw_unary(channel, method: str, body: bytes, metadata=()) -> grpc.aio.AioRpcError:
    call = channel.unary_unary(method)  # no serializers: bytes go out as they are
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await call(body, timeout=5, metadata=metadata)
    return exc.value


async def _raw_stream(channel, method: str, body: bytes, metadata=()) -> grpc.aio.AioRpcError:
    call = channel.unary_stream(method)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        async for _ in call(body, timeout=5, metadata=metadata):
            pass
    return exc.value


@pytest.mark.parametrize("body", [BAD_UTF8, TRUNCATED], ids=["bad-utf8", "truncated"])
async def test_unparsable_request_is_invalid_argument_on_every_rpc(channel, body):
    for method in METHODS:
        err = await _raw_unary(channel, method, body)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, err)
        assert (error_reason(err), error_field(err)) == ("MALFORMED_REQUEST", "request")
    for method in STREAMS:
        err = await _raw_stream(channel, method, body)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, err)


async def test_unparsable_request_without_token_is_unauthenticated(redis_url):
    gw = Gateway(gateway_settings(redis_url, auth_tokens="wtok-12345678=worker:w1"), redis_url)
    await gw.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
            err = await _raw_unary(ch, "/dtq.v1.Broker/Heartbeat", BAD_UTF8)
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            err = await _raw_unary(ch, "/dtq.v1.Broker/Heartbeat", BAD_UTF8,
                                   metadata=(("authorization", "Bearer wtok-12345678"),))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await gw.stop()


async def test_fail_error_text_is_cut_by_utf8_bytes(broker_stub):
    r = await broker_stub.Enqueue(pb.EnqueueRequest(queue="q", task_type="t", payload=b"{}",
                                                    max_attempts=1))
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    task = await lease.next()
    message, error_class = "é" * 3000, "Ж" * 100  # 6000 and 200 bytes of UTF-8
    await broker_stub.Fail(pb.FailRequest(items=[pb.FailItem(
        lease_id=task.lease_id, error_message=message, error_class=error_class)]))
    got = (await broker_stub.GetTask(pb.GetTaskRequest(task_id=r.task_id))).task
    lease.close()
    stored_message, stored_class = got.attempts[0].error_message, got.attempts[0].error_class
    assert len(stored_message.encode()) == 4096 and stored_message == "é" * 2048
    assert len(stored_class.encode()) == 128 and stored_class == "Ж" * 64
