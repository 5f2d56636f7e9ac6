"""Sync and async handlers: payload decoding, result encoding, context, threads."""

from __future__ import annotations

import json
import threading

from dtq_proto import dtq_pb2
from dtq_pyworker import TaskContext
from tests.worker.helpers import make_worker, running


async def test_async_handler_result_is_json_encoded_and_acked(fake):
    worker = make_worker(fake)
    seen: list[tuple[object, TaskContext]] = []

    @worker.task("add")
    async def add(payload, ctx):
        seen.append((payload, ctx))
        return {"sum": payload["a"] + payload["b"]}

    async with running(worker):
        lease = await fake.push("add", json.dumps({"a": 2, "b": 3}).encode(),
                                metadata={"k": "v"}, attempt=2)
        await fake.wait_for(lambda: lease in fake.acked())
    assert json.loads(fake.acked()[lease]) == {"sum": 5}
    payload, ctx = seen[0]
    assert payload == {"a": 2, "b": 3}
    assert (ctx.lease_id, ctx.task_type, ctx.queue, ctx.attempt) == (lease, "add", "q", 2)
    assert ctx.metadata == {"k": "v"} and ctx.worker_id == "w-test"
    assert not ctx.cancelled.is_set()
    assert worker.stats["processed"] == 1


async def test_sync_handler_runs_in_pool_thread_and_bytes_result_kept(fake):
    worker = make_worker(fake)
    threads: list[str] = []

    @worker.task("raw")
    def raw(payload, ctx):
        threads.append(threading.current_thread().name)
        return payload[::-1]

    async with running(worker):
        lease = await fake.push("raw", b"\x00\x01abc", content_type="application/octet-stream")
        await fake.wait_for(lambda: lease in fake.acked())
    assert fake.acked()[lease] == b"cba\x01\x00"
    assert threads[0].startswith("dtq-handler")
    assert threads[0] != threading.current_thread().name


async def test_lease_request_carries_registered_types_and_default_in_flight(fake):
    worker = make_worker(fake, concurrency=3, labels={"zone": "a"})
    worker.register("b.type", lambda p, c: None)
    worker.register("a.type", lambda p, c: None)
    async with running(worker):
        await fake.wait_for(lambda: fake.lease_requests)
    req = fake.lease_requests[0]
    assert list(req.task_types) == ["a.type", "b.type"]
    assert req.max_in_flight == 6 and req.concurrency == 3
    assert list(req.queues) == ["q"] and req.worker_id == "w-test"
    assert dict(req.labels) == {"zone": "a"} and req.sdk.startswith("dtq-pyworker/")


async def test_none_result_and_empty_json_payload(fake):
    worker = make_worker(fake)
    got = []

    @worker.task("noop")
    def noop(payload, ctx):
        got.append(payload)

    async with running(worker):
        lease = await fake.push("noop", b"")
        await fake.wait_for(lambda: lease in fake.acked())
    assert got == [None] and fake.acked()[lease] == b""


async def test_invalid_json_payload_is_a_permanent_failure(fake):
    worker = make_worker(fake)
    worker.register("t", lambda p, c: None)
    async with running(worker):
        lease = await fake.push("t", b"{not json")
        await fake.wait_for(lambda: lease in fake.failed())
    item = fake.failed()[lease]
    assert item.error_class == "PayloadDecodeError" and item.retryable is False
    assert item.mode == dtq_pb2.FAIL_MODE_FAILURE


async def test_sync_wrapper_returning_a_coroutine_is_awaited(fake):
    worker = make_worker(fake)

    async def real(payload, ctx):
        return {"via": "wrapper"}

    worker.register("wrapped", lambda payload, ctx: real(payload, ctx))
    async with running(worker):
        lease = await fake.push("wrapped")
        await fake.wait_for(lambda: lease in fake.acked())
    assert json.loads(fake.acked()[lease]) == {"via": "wrapper"}


async def test_async_callable_object_runs_on_the_loop(fake):
    worker = make_worker(fake)
    threads = []

    class Handler:
        async def __call__(self, payload, ctx):
            threads.append(threading.current_thread())
            return 1

    worker.register("obj", Handler())
    async with running(worker):
        lease = await fake.push("obj")
        await fake.wait_for(lambda: lease in fake.acked())
    assert threads == [threading.current_thread()]
