"""Producer clients against the fake Broker: enqueue, batch, get, wait, cancel, errors."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from dtq_proto import dtq_pb2
from dtq_pyworker import (
    AdminClient,
    AsyncClient,
    Client,
    DtqRpcError,
    EnqueueResult,
    TaskCancelled,
    TaskFailed,
)
from tests.worker.fake_broker import ThreadedFakeBroker


@pytest.fixture
def threaded():
    fake = ThreadedFakeBroker()
    yield fake
    fake.close()


def test_sync_enqueue_encodes_payload_and_options(threaded):
    with Client(threaded.target) as client:
        res = client.enqueue("demo", "file.stats", {"path": "/x.py"}, priority=7,
                             max_attempts=2, idempotency_key="k1", metadata={"a": 1},
                             retry_policy={"backoff_base_ms": 10})
        again = client.enqueue("demo", "file.stats", {"path": "/x.py"}, idempotency_key="k1")
        task = client.get_task(res.task_id)
    assert isinstance(res, EnqueueResult) and not res.deduplicated
    assert res.status == dtq_pb2.TASK_STATUS_QUEUED
    assert again.deduplicated and again.task_id == res.task_id
    assert task.payload == {"path": "/x.py"} and json.loads(task.payload_bytes) == task.payload
    assert task.content_type == "application/json"
    assert (task.priority, task.max_attempts, dict(task.metadata)) == (7, 2, {"a": "1"})


def test_sync_bytes_payload_is_octet_stream(threaded):
    with Client(threaded.target) as client:
        task = client.get_task(client.enqueue("demo", "raw", b"\x00\xff").task_id)
    assert task.payload == b"\x00\xff" and task.content_type == "application/octet-stream"
    assert task.payload_bytes == b"\x00\xff"


def test_sync_error_carries_reason_and_field(threaded):
    with Client(threaded.target) as client:
        with pytest.raises(DtqRpcError) as info:
            client.enqueue("", "t", {})
        with pytest.raises(DtqRpcError) as missing:
            client.get_task("0" * 32)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.reason, info.value.field) == ("INVALID_FIELD", "queue")
    assert (missing.value.code, missing.value.reason) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")


def test_sync_batch_answers_per_item(threaded):
    with Client(threaded.target) as client:
        results = client.enqueue_batch([
            {"queue": "demo", "task_type": "t", "payload": {"i": 1}, "priority": 9},
            {"queue": "", "task_type": "t", "payload": {"i": 2}},
        ])
    assert isinstance(results[0], EnqueueResult) and results[0].task_id
    assert isinstance(results[1], DtqRpcError)
    assert (results[1].code, results[1].reason, results[1].field) == (
        grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", "queue")


def test_sync_batch_rejects_unknown_options(threaded):
    with Client(threaded.target) as client, pytest.raises(TypeError):
        client.enqueue_batch([{"queue": "q", "task_type": "t", "colour": "red"}])


def test_enqueue_refuses_integers_a_field_cannot_hold_naming_the_field(threaded):
    with Client(threaded.target) as client:
        with pytest.raises(ValueError, match=r"^delay_ms: must be 0\.\.18446744073709551615, "
                                             r"got -1$"):
            client.enqueue("q", "t", {}, delay_ms=-1)
        with pytest.raises(ValueError, match=r"^retry_policy\.backoff_base_ms: must be "):
            client.enqueue("q", "t", {}, retry_policy={"backoff_base_ms": 1 << 32})
        with pytest.raises(TypeError, match=r"^max_attempts: expected an integer, got str$"):
            client.enqueue("q", "t", {}, max_attempts="3")
        with pytest.raises(ValueError, match=r"^timeout_ms: must be "):
            client.enqueue_batch([{"queue": "q", "task_type": "t", "timeout_ms": 1 << 40}])
    assert threaded.broker.tasks == {}


def test_enqueue_debounce_option_builds_the_message_or_refuses_it(threaded):
    from dtq_pyworker._requests import enqueue_request

    req = enqueue_request("q", "t", {}, debounce={"key": "k", "window_ms": 500,
                                                   "mode": "keep_last", "max_delay_ms": 2000})
    assert req.debounce == dtq_pb2.Debounce(key="k", window_ms=500, max_delay_ms=2000,
                                            mode=dtq_pb2.DEBOUNCE_MODE_KEEP_LAST)
    with Client(threaded.target) as client:
        with pytest.raises(ValueError, match=r"^debounce\.mode: one of "):
            client.enqueue("q", "t", {}, debounce={"key": "k", "window_ms": 5, "mode": "last"})
        with pytest.raises(ValueError, match=r"^debounce\.window_ms: must be "):
            client.enqueue("q", "t", {}, debounce={"key": "k", "window_ms": -5,
                                                   "mode": "keep_first"})
    assert threaded.broker.tasks == {}


def test_admin_client_refuses_integers_a_field_cannot_hold_naming_the_field():
    with AdminClient("127.0.0.1:1") as admin:  # refused before sending: no gateway needed
        with pytest.raises(ValueError, match=r"^rate_limit\.limit: must be 0\.\.4294967295, "
                                             r"got 999999999999$"):
            admin.set_rate_limit("q", 999_999_999_999, 1000)
        with pytest.raises(ValueError, match=r"^rate_limit\.period_ms: must be 0\.\."):
            admin.set_rate_limit("q", 10, -1)
        with pytest.raises(ValueError, match=r"^limit: must be 0\.\.4294967295"):
            admin.recent_tasks(limit=1 << 32)
        with pytest.raises(ValueError, match=r"^min_age_ms: must be -9223372036854775808\.\."):
            admin.redrive_dead_letters(min_age_ms=1 << 63)


def test_sync_wait_polls_until_terminal_and_cancel(threaded):
    with Client(threaded.target) as client:
        task_id = client.enqueue("demo", "t", {}).task_id
        broker = threaded.broker

        async def finish_after_two_polls():
            await broker.wait_for(lambda: broker.get_task_calls >= 2)
            broker.tasks[task_id].status = dtq_pb2.TASK_STATUS_SUCCEEDED

        done = asyncio.run_coroutine_threadsafe(finish_after_two_polls(), threaded.loop)
        task = client.wait(task_id, timeout_s=10)
        done.result(5)
        assert task.status == dtq_pb2.TASK_STATUS_SUCCEEDED
        other = client.enqueue("demo", "t", {}).task_id
        resp = client.cancel(other, reason="test")
        assert resp.status == dtq_pb2.TASK_STATUS_CANCELLED
        with pytest.raises(TaskCancelled):
            client.wait(other, timeout_s=1)
        assert (client.wait(other, timeout_s=1, raise_on_failure=False).status
                == dtq_pb2.TASK_STATUS_CANCELLED)


def test_sync_wait_times_out(threaded):
    with Client(threaded.target) as client:
        task_id = client.enqueue("demo", "t", {}).task_id
        with pytest.raises(TimeoutError):
            client.wait(task_id, timeout_s=0.1)


async def test_async_client_roundtrip(fake):
    async with AsyncClient(fake.target) as client:
        res = await client.enqueue("demo", "t", {"x": 1}, delay_ms=5, timeout_ms=100)
        task = await client.get_task(res.task_id)
        assert task.timeout_ms == 100
        batch = await client.enqueue_batch([{"queue": "demo", "task_type": "t"},
                                            {"queue": "", "task_type": "t"}])
        assert isinstance(batch[0], EnqueueResult) and isinstance(batch[1], DtqRpcError)
        with pytest.raises(DtqRpcError) as info:
            await client.enqueue("", "t")
        assert info.value.field == "queue"
        fake.tasks[res.task_id].status = dtq_pb2.TASK_STATUS_DEAD_LETTERED
        with pytest.raises(TaskFailed) as failed:
            await client.wait(res.task_id, 5)
        assert failed.value.task.status == dtq_pb2.TASK_STATUS_DEAD_LETTERED
        cancelled = await client.cancel(batch[0].task_id)
        assert cancelled.status == dtq_pb2.TASK_STATUS_CANCELLED


async def test_async_unreachable_gateway_is_unavailable(fake):
    # a deadline past the retries of GetTask (about 4 s): the last attempt's status
    async with AsyncClient("127.0.0.1:1", timeout_s=10) as client:
        with pytest.raises(DtqRpcError) as info:
            await client.get_task("x")
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
