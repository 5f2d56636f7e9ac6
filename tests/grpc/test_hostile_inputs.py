"""Inputs that used to end in INTERNAL (or stored without bound) answer a documented
status naming the field, on a real gateway; nothing is logged at ERROR."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest
import redis
import redis.asyncio as aioredis

from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.support.leasing import error_field, error_reason, poll

U64 = (1 << 64) - 1


@pytest.fixture
def admin(channel):
    return dtq_pb2_grpc.AdminStub(channel)


@pytest.fixture(autouse=True)
def no_error_logs(caplog):
    caplog.set_level(logging.WARNING)
    yield
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


async def _invalid(coro, field: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await coro
    assert (exc.value.code(), error_field(exc.value)) == (
        grpc.StatusCode.INVALID_ARGUMENT, field), exc.value


def _enq(payload: bytes, content_type: str = "") -> pb.EnqueueRequest:
    return pb.EnqueueRequest(queue="q", task_type="t", payload=payload,
                             content_type=content_type)


DEEP = b"[" * 986 + b"]" * 986
NOT_RFC8259 = [DEEP, b"[" * 200_000, b"NaN", b'{"a": Infinity}', b"[-Infinity]",
               '{"a": 1}'.encode("utf-16"), '{"a": 1}'.encode("utf-32-le"),
               b"\xef\xbb\xbf{}", b'{"a": "\xff"}']


async def test_json_payloads_follow_rfc8259_per_item(broker_stub):
    for payload in NOT_RFC8259:
        await _invalid(broker_stub.Enqueue(_enq(payload)), "payload")
    items = [_enq(b"{}")] + [_enq(p) for p in NOT_RFC8259] + [_enq(b'{"ok": [1, 2.5e3]}')]
    reply = await broker_stub.EnqueueBatch(pb.EnqueueBatchRequest(items=items))
    assert reply.results[0].task_id and reply.results[-1].task_id
    for i, res in enumerate(reply.results[1:-1], start=1):
        assert (res.error.code, res.error.field) == (
            grpc.StatusCode.INVALID_ARGUMENT.value[0], f"items[{i}].payload"), res


async def test_plus_json_and_parameters_are_validated_other_types_are_opaque(broker_stub):
    for ctype in ("application/problem+json", "application/vnd.acme.v1+json",
                  "application/json; charset=utf-8", "Application/JSON"):
        await _invalid(broker_stub.Enqueue(_enq(b"{nope", ctype)), "payload")
        assert (await broker_stub.Enqueue(_enq(b'{"a": 1}', ctype))).task_id
    for ctype in ("text/plain", "application/octet-stream", "application/jsonx"):
        assert (await broker_stub.Enqueue(_enq(b"NaN \xff{", ctype))).task_id


async def test_huge_heartbeat_counters_do_not_break_list_workers(broker_stub, admin):
    await broker_stub.Heartbeat(pb.HeartbeatRequest(
        worker_id="w-max", counters=pb.WorkerCounters(
            tasks_processed=U64, tasks_failed=U64, tasks_retried=U64 - 1)))
    workers = (await admin.ListWorkers(pb.ListWorkersRequest())).workers
    (w,) = [w for w in workers if w.worker_id == "w-max"]
    assert (w.tasks_processed, w.tasks_failed, w.tasks_retried) == (U64, U64, U64 - 1)


@pytest.mark.parametrize("token", ["0-0", "18446744073709551616-0", "1-18446744073709551616",
                                   "99999999999999999999-1", "1-", "-1", "1-1-1"])
async def test_bad_page_tokens_are_invalid_argument(admin, token):
    await _invalid(admin.ListAudit(pb.ListAuditRequest(page_token=token)), "page_token")
    await _invalid(admin.ListDeadLetters(pb.ListDeadLettersRequest(page_token=token)),
                   "page_token")


async def test_stored_worker_strings_are_bounded(broker_stub):
    await _invalid(broker_stub.Heartbeat(pb.HeartbeatRequest(
        worker_id="w1", hostname="h" * (1 << 20))), "hostname")
    lease = broker_stub.Lease(pb.LeaseRequest(worker_id="w1", queues=["q"], max_in_flight=1,
                                              hostname="é" * 200))
    await _invalid(lease.read(), "hostname")
    for field, extra in (("labels", {"labels": {f"k{i}": "v" for i in range(65)}}),
                         ("labels", {"labels": {"k": "v" * 1025}}),
                         ("sdk", {"sdk": "s" * 129})):
        lease = broker_stub.Lease(pb.LeaseRequest(worker_id="w1", queues=["q"],
                                                  max_in_flight=1, **extra))
        await _invalid(lease.read(), field)
    for task_types in (["t"] * 2_000, ["x" * 129], ["bad type"]):
        lease = broker_stub.Lease(pb.LeaseRequest(worker_id="w1", queues=["q"],
                                                  max_in_flight=1, task_types=task_types))
        await _invalid(lease.read(), "task_types")


async def test_a_busy_redis_is_unavailable_not_internal(broker_stub, redis_url):
    """A script running past busy-reply-threshold makes Redis answer BUSY: the caller
    gets UNAVAILABLE with RetryInfo (transient), not INTERNAL."""
    blocker = aioredis.Redis.from_url(redis_url)
    control = aioredis.Redis.from_url(redis_url)
    await control.config_set("busy-reply-threshold", 50)
    spin = asyncio.create_task(blocker.eval(
        "local t = redis.call('TIME') while true do end", 0))
    try:
        async def busy() -> bool:
            try:
                await control.ping()
            except redis.exceptions.ResponseError as exc:
                return str(exc).startswith("BUSY")
            return False

        await poll(busy, bool)  # past the threshold: every command now answers BUSY
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await broker_stub.GetTask(pb.GetTaskRequest(task_id="a" * 32), timeout=5)
        assert (exc.value.code(), error_reason(exc.value)) == (
            grpc.StatusCode.UNAVAILABLE, "REDIS_UNAVAILABLE")
    finally:
        await control.script_kill()
        with pytest.raises(redis.exceptions.ResponseError):  # "Script killed by user"
            await spin
        await control.config_set("busy-reply-threshold", 5000)
        await blocker.aclose()
        await control.aclose()
