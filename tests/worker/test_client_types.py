"""Typed client results against the fake Broker: Task fields, status enum, UTC
datetimes, decoded payload/result, the wait exceptions and task handles."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dtq_proto import dtq_pb2
from dtq_pyworker import (
    AsyncClient,
    CancelResult,
    Client,
    Task,
    TaskCancelled,
    TaskExpired,
    TaskFailed,
    TaskHandle,
    TaskNotSucceeded,
    TaskStatus,
    TaskWaitTimeout,
    Worker,
)
from dtq_pyworker.tasks import decode_result
from tests.worker.fake_broker import ThreadedFakeBroker

T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


@pytest.fixture
def threaded():
    fake = ThreadedFakeBroker()
    yield fake
    fake.close()


def _finish(threaded, task_id: str, status: int, **fields) -> None:
    task = threaded.broker.tasks[task_id]
    task.status = status
    for name, value in fields.items():
        if name == "attempts":
            task.attempts.extend(value)
        else:
            setattr(task, name, value)


def test_get_task_answers_a_typed_task(threaded):
    with Client(threaded.target) as client:
        res = client.enqueue("q", "t", {"n": 1}, priority=8)
        _finish(threaded, res.task_id, dtq_pb2.TASK_STATUS_SUCCEEDED, result=b'{"ok":true}',
                created_at_ms=T0_MS, finished_at_ms=T0_MS + 1500, last_error="boom",
                last_error_class="ValueError",
                attempts=[dtq_pb2.AttemptRecord(attempt=1, worker_id="w1", started_at_ms=T0_MS,
                                                finished_at_ms=T0_MS + 1500,
                                                outcome="succeeded")])
        task = client.get(res.task_id)
    assert isinstance(task, Task) and res.status is TaskStatus.QUEUED
    assert task.status is TaskStatus.SUCCEEDED and task.status == dtq_pb2.TASK_STATUS_SUCCEEDED
    assert task.terminal and task.status.name == "SUCCEEDED"
    assert (task.payload, task.result, task.priority) == ({"n": 1}, {"ok": True}, 8)
    assert task.created_at == datetime(2026, 1, 1, tzinfo=UTC)
    assert task.finished_at.tzinfo is UTC and task.started_at is None
    assert (task.finished_at - task.created_at).total_seconds() == 1.5
    assert (task.error, task.error_class) == ("boom", "ValueError")
    [attempt] = task.attempts
    assert (attempt.attempt, attempt.worker_id, attempt.outcome) == (1, "w1", "succeeded")
    assert attempt.started_at == task.created_at and attempt.finished_at_ms == T0_MS + 1500
    # raw protobuf access stays: .raw, and unknown attributes fall through to it
    assert task.raw.result == task.result_bytes == b'{"ok":true}'
    assert task.created_at_ms == T0_MS and task.last_error_class == "ValueError"


def test_typed_task_declares_progress_and_chain_fields(threaded):
    with Client(threaded.target) as client:
        res = client.enqueue("q", "t", {})
        _finish(threaded, res.task_id, dtq_pb2.TASK_STATUS_ACTIVE, progress_percent=40.0,
                progress_message="resizing", progress_at_ms=T0_MS, chain_id="c1",
                chain_step=2, next_task_id="", group_id="g1")
        task = client.get(res.task_id)
    assert (task.progress_percent, task.progress_message) == (40.0, "resizing")
    assert task.progress_at == datetime(2026, 1, 1, tzinfo=UTC)
    assert (task.chain_id, task.chain_step, task.next_task_id, task.group_id) == (
        "c1", 2, "", "g1")
    assert "progress_percent" in Task.__dataclass_fields__


def test_results_that_are_not_json_stay_bytes():
    assert decode_result(b"") is None
    assert decode_result(b"\xff\x00") == b"\xff\x00"
    assert decode_result(b"plain text") == b"plain text"
    assert decode_result(b'{"cut":', truncated=True) == b'{"cut":'
    assert decode_result(b"[1,2]") == [1, 2]


@pytest.mark.parametrize(("status", "exc"), [
    (dtq_pb2.TASK_STATUS_DEAD_LETTERED, TaskFailed),
    (dtq_pb2.TASK_STATUS_CANCELLED, TaskCancelled),
    (dtq_pb2.TASK_STATUS_EXPIRED, TaskExpired),
])
def test_wait_raises_for_each_unsuccessful_end(threaded, status, exc):
    with Client(threaded.target) as client:
        task_id = client.enqueue("q", "t", {}).task_id
        _finish(threaded, task_id, status, last_error="no disk", last_error_class="OSError")
        with pytest.raises(exc) as info:
            client.wait(task_id, timeout_s=5)
        returned = client.wait(task_id, timeout_s=5, raise_on_failure=False)
    assert isinstance(info.value, TaskNotSucceeded)
    assert info.value.task.task_id == task_id == info.value.task_id
    assert info.value.status == status == returned.status
    assert (info.value.error, info.value.error_class) == ("no disk", "OSError")
    assert "no disk" in str(info.value)


def test_wait_timeout_carries_the_last_task(threaded):
    with Client(threaded.target) as client:
        task_id = client.enqueue("q", "t", {}).task_id
        with pytest.raises(TaskWaitTimeout) as info:
            client.wait(task_id, timeout_s=0.05)
    assert isinstance(info.value, TimeoutError)
    assert info.value.task.status is TaskStatus.QUEUED


def test_cancel_answers_a_cancel_result(threaded):
    with Client(threaded.target) as client:
        task_id = client.enqueue("q", "t", {}).task_id
        res = client.cancel(task_id, reason="because")
    assert res == CancelResult(TaskStatus.CANCELLED, False, "r1")


async def test_async_client_is_typed_too(fake):
    async with AsyncClient(fake.target) as client:
        res = await client.enqueue("q", "t", b"raw", content_type="text/plain")
        task = await client.get(res.task_id)
        assert (task.payload, task.content_type) == (b"raw", "text/plain")
        fake.tasks[res.task_id].status = dtq_pb2.TASK_STATUS_EXPIRED
        with pytest.raises(TaskExpired):
            await client.wait(res.task_id, 5)


def test_task_handle_enqueues_by_function(threaded):
    worker = Worker(["emails"], threaded.target)

    @worker.task("email.send")
    def send(payload, ctx):
        return {"to": payload["to"]}

    @worker.task("email.bounce", queue="bounces")
    async def bounce(payload, ctx):
        return None

    assert isinstance(send, TaskHandle) and send.__name__ == "send"
    assert send({"to": "a"}, None) == {"to": "a"}  # still the handler
    assert worker.handlers["email.bounce"].is_async
    with Client(threaded.target) as client:
        res = send.enqueue({"to": "ada@example.com"}, client=client, priority=7)
        other = bounce.using(client)({"id": 3})
        default = send.enqueue({"to": "x"})  # the worker's own client
        tasks = [client.get(r.task_id) for r in (res, other, default)]
    worker.client().close()
    assert [(t.queue, t.task_type) for t in tasks] == [
        ("emails", "email.send"), ("bounces", "email.bounce"), ("emails", "email.send")]
    assert tasks[0].payload == {"to": "ada@example.com"} and tasks[0].priority == 7


async def test_task_handle_with_an_async_client(fake):
    worker = Worker(["jobs"], fake.target)

    @worker.task("job.run")
    async def run(payload, ctx):
        return payload

    async with AsyncClient(fake.target) as client:
        res = await run.enqueue({"n": 1}, client=client, delay_ms=10)
        task = await client.get(res.task_id)
    assert (task.queue, task.task_type, task.payload) == ("jobs", "job.run", {"n": 1})
