"""Progress, chains, groups and tracing with the Python worker and client against the
real in-process gateway and a private Redis."""

from __future__ import annotations

import asyncio
import threading

import pytest

from dtq_proto import dtq_pb2
from dtq_pyworker import AsyncClient, ChainState, Client, PermanentError, TaskFailed, Worker
from tests.worker.helpers import running


def _worker(gateway, **kwargs) -> Worker:
    kwargs.setdefault("worker_id", "w-follow")
    kwargs.setdefault("drain_grace_s", 5)
    return Worker(["fq", "fq2"], f"127.0.0.1:{gateway.port}", **kwargs)


async def _poll(client, task_id, predicate, timeout_s=10.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        task = await client.get_task(task_id)
        if predicate(task):
            return task
        assert asyncio.get_running_loop().time() < deadline, f"last: {task}"
        await asyncio.sleep(0.05)


async def test_handler_progress_reaches_get_task(gateway):
    worker = _worker(gateway)
    release = threading.Event()

    @worker.task("resize")
    def resize(payload, ctx):
        ctx.progress(10, "loading")
        ctx.progress(40, "resizing")  # the latest report wins
        release.wait(10)
        return "done"

    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client, running(worker):
        task_id = (await client.enqueue("fq", "resize", {})).task_id
        seen = await _poll(client, task_id, lambda t: t.progress_message == "resizing")
        assert seen.progress_percent == 40.0
        release.set()
        done = await client.wait(task_id, 10)
    assert done.status == dtq_pb2.TASK_STATUS_SUCCEEDED


async def test_progress_of_a_handler_that_returns_at_once_is_stored(gateway):
    """README: ``ctx.progress(40, "resizing")`` then ``return`` at once: the report
    goes out ahead of the Ack, so the finished task shows it."""
    worker = _worker(gateway)

    @worker.task("resize")
    def resize(payload, ctx):
        ctx.progress(40, "resizing")
        return {"frames": 120}

    @worker.task("resize_async")
    async def resize_async(payload, ctx):
        ctx.progress(60, "async")
        raise PermanentError("broken")

    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client, running(worker):
        task_id = (await client.enqueue("fq", "resize", {})).task_id
        failed_id = (await client.enqueue("fq", "resize_async", {})).task_id
        done = await _poll(client, task_id, lambda t: t.status == dtq_pb2.TASK_STATUS_SUCCEEDED)
        failed = await _poll(client, failed_id,
                             lambda t: t.status == dtq_pb2.TASK_STATUS_DEAD_LETTERED)
    assert (done.progress_percent, done.progress_message) == (40.0, "resizing")
    assert (failed.progress_percent, failed.progress_message) == (60.0, "async")

async def test_progress_goes_out_before_the_next_heartbeat(redis_url):
    """With a 30 s heartbeat interval each report still reaches the gateway within a
    few seconds: a report wakes the heartbeat loop (at most one early beat per second)."""
    from dtq_gateway.server import Gateway
    from tests.conftest import gateway_settings

    gw = Gateway(gateway_settings(redis_url, heartbeat_interval_s=30,
                                  visibility_timeout_s=90), redis_url)
    await gw.start()
    try:
        worker = _worker(gw)
        step, release = threading.Event(), threading.Event()

        @worker.task("resize")
        def resize(payload, ctx):
            ctx.progress(25, "first")
            step.wait(10)
            ctx.progress(75, "second")
            release.wait(10)
            return "done"

        async with AsyncClient(f"127.0.0.1:{gw.port}") as client, running(worker):
            task_id = (await client.enqueue("fq", "resize", {})).task_id
            seen = await _poll(client, task_id, lambda t: t.progress_message == "first", 5)
            assert seen.progress_percent == 25.0
            step.set()
            seen = await _poll(client, task_id, lambda t: t.progress_message == "second", 5)
            assert seen.progress_percent == 75.0
            release.set()
            done = await client.wait(task_id, 10)
        assert done.status == dtq_pb2.TASK_STATUS_SUCCEEDED
    finally:
        release.set()
        await gw.stop()


async def test_chain_and_group_with_the_client(gateway):
    worker = _worker(gateway)

    @worker.task("add")
    def add(payload, ctx):
        return payload + 1 if isinstance(payload, int) else 1

    @worker.task("collect")
    def collect(payload, ctx):
        return sorted(m["result"] for m in payload["members"])

    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client, running(worker):
        first = await client.enqueue("fq", "add", 1, chain=[
            {"queue": "fq2", "task_type": "add"}, {"queue": "fq", "task_type": "add"}])
        last = await client.wait_chain(first, 15)
        assert (last.task_id, last.result) == (first.chain_task_ids[-1], 4)
        group = await client.enqueue_group(
            [{"queue": "fq", "task_type": "add", "payload": n} for n in (1, 5, 9)],
            callback={"queue": "fq2", "task_type": "collect"})
        summary = await client.wait(group.callback_task_id, 15, missing_ok=True)
    assert summary.result == [2, 6, 10]


@pytest.fixture
def spans():
    """An in-memory span exporter on an SDK tracer provider, installed globally for the
    test only (the global provider can be set once per process: it is set once, and
    the test's processor is detached again, so other tests trace nothing)."""
    trace = pytest.importorskip("opentelemetry.trace")
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    previous = trace._TRACER_PROVIDER  # the API has no public reset: tests restore it
    trace._TRACER_PROVIDER = provider
    try:
        yield exporter
    finally:
        trace._TRACER_PROVIDER = previous
        provider.shutdown()


async def test_one_trace_spans_producer_gateway_and_worker(gateway, spans):
    from opentelemetry import trace

    worker = _worker(gateway)
    seen = {}

    @worker.task("traced")
    def traced(payload, ctx):
        seen["traceparent"] = ctx.traceparent

    tracer = trace.get_tracer("test")
    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client, running(worker):
        with tracer.start_as_current_span("checkout") as root:
            task_id = (await client.enqueue("fq", "traced", {})).task_id
        done = await client.wait(task_id, 10)
    trace_id = root.get_span_context().trace_id
    assert done.traceparent.split("-")[1] == f"{trace_id:032x}"
    assert seen["traceparent"] == done.traceparent
    by_name = {s.name: s for s in spans.get_finished_spans()
               if s.context.trace_id == trace_id}
    assert {"checkout", "dtq.enqueue", "dtq.gateway.enqueue", "dtq.gateway.deliver",
            "dtq.handle traced"} <= set(by_name)
    producer = by_name["dtq.enqueue"]
    assert by_name["dtq.gateway.enqueue"].parent.span_id == producer.context.span_id
    assert by_name["dtq.handle traced"].parent.span_id == producer.context.span_id
    assert by_name["dtq.handle traced"].kind == trace.SpanKind.CONSUMER



async def test_traceparent_is_the_producers_or_empty(gateway):
    """README: a task carries the traceparent its producer gave; a plain client with no
    tracer provider configured sends none, and dtq makes none up."""
    worker = _worker(gateway)
    seen = {}

    @worker.task("traced")
    def traced(payload, ctx):
        seen[payload] = ctx.traceparent

    given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client, running(worker):
        plain = (await client.enqueue("fq", "traced", "plain")).task_id
        explicit = (await client.enqueue("fq", "traced", "explicit",
                                         traceparent=given)).task_id
        plain_task = await client.wait(plain, 10)
        explicit_task = await client.wait(explicit, 10)
    assert plain_task.traceparent == "" and seen["plain"] == ""
    assert explicit_task.traceparent == given and seen["explicit"] == given


async def test_wait_chain_raises_for_the_step_that_broke_it(gateway):
    """Like wait: a broken chain raises TaskFailed (its .task is the step) unless
    raise_on_failure=False; chain_state is a ChainState enum, not a bare int."""
    worker = _worker(gateway)

    @worker.task("bad")
    def bad(payload, ctx):
        raise PermanentError("no")

    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client, running(worker):
        first = await client.enqueue("fq", "bad", {}, chain=[{"queue": "fq", "task_type": "bad"}])
        with pytest.raises(TaskFailed) as raised:
            await client.wait_chain(first, 10)
        broken = await client.wait_chain(first, 10, raise_on_failure=False)

        def sync_wait_chain() -> None:  # the blocking Client raises the same way
            with Client(f"127.0.0.1:{gateway.port}") as sync_client, \
                    pytest.raises(TaskFailed):
                sync_client.wait_chain(first, 10)

        await asyncio.get_running_loop().run_in_executor(None, sync_wait_chain)
    assert raised.value.task.task_id == first.task_id
    assert (broken.task_id, broken.status) == (first.task_id, dtq_pb2.TASK_STATUS_DEAD_LETTERED)
    assert broken.chain_state is ChainState.BROKEN
    assert broken.chain_state == dtq_pb2.CHAIN_STATE_BROKEN  # still equal to the proto value

