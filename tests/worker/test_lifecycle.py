"""Reconnect after the Lease stream fails, and graceful drain."""

from __future__ import annotations

import asyncio
import threading

import pytest

from dtq_proto import dtq_pb2
from dtq_pyworker import Worker
from tests.worker.fake_broker import FakeBroker, start_server
from tests.worker.helpers import make_worker, poll_until, running, wait_event


async def test_reconnect_after_unavailable_keeps_running_handlers(fake):
    worker = make_worker(fake)
    started, release = asyncio.Event(), asyncio.Event()

    @worker.task("block")
    async def block(payload, ctx):
        started.set()
        await release.wait()
        return "kept"

    worker.register("quick", lambda p, c: "q")
    async with running(worker):
        lease = await fake.push("block")
        await wait_event(started)
        await fake.abort_streams()
        await fake.wait_for(lambda: len(fake.lease_requests) >= 2 and fake.open_streams == 1)
        assert worker.stats["reconnects"] == 1
        seen = len(fake.heartbeats)
        await fake.wait_for(lambda: len(fake.heartbeats) > seen)
        assert lease in fake.heartbeats[-1].lease_ids  # still extended after reconnect
        after = await fake.push("quick")
        await fake.wait_for(lambda: after in fake.acked())
        release.set()
        await fake.wait_for(lambda: lease in fake.acked())
    assert fake.acked()[lease] == b'"kept"'


async def test_reconnect_when_gateway_is_down_at_start():
    broker = FakeBroker()
    server, target = await start_server(broker)
    await server.stop(None)  # nothing listens there now
    worker = Worker(["q"], target, worker_id="w-late", drain_grace_s=1)
    worker.register("t", lambda p, c: "ok")
    task = asyncio.create_task(worker.run_async(install_signal_handlers=False))
    try:
        # the Lease call waits for the connection (wait_for_ready) instead of failing
        await poll_until(lambda: worker._state is not None and worker._state.stream_open)
        port = int(target.rsplit(":", 1)[1])
        server, _ = await start_server(broker, port)
        lease = await broker.push("t")
        await broker.wait_for(lambda: lease in broker.acked(), timeout_s=10)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
        await server.stop(None)


async def test_drain_releases_buffered_and_finishes_running(fake):
    worker = make_worker(fake, concurrency=1, max_in_flight=3, drain_grace_s=10)
    started: list[str] = []
    release = asyncio.Event()

    @worker.task("t")
    async def t(payload, ctx):
        started.append(ctx.lease_id)
        await release.wait()
        return "finished"

    task = asyncio.create_task(worker.run_async(install_signal_handlers=False))
    leases = [await fake.push("t") for _ in range(3)]
    await fake.wait_for(lambda: len(fake.delivered) == 3 and fake.open_streams == 1)
    await fake.wait_for(lambda: any(set(leases) <= set(h.lease_ids) for h in fake.heartbeats))
    worker.stop()
    # buffered ones are handed back at once, while the running one is still running
    await fake.wait_for(lambda: set(leases[1:]) <= set(fake.failed()))
    assert fake.open_streams == 0 and not task.done()
    release.set()
    await asyncio.wait_for(task, 10)
    assert started == [leases[0]]
    assert fake.acked()[leases[0]] == b'"finished"'
    for lease in leases[1:]:
        assert fake.failed()[lease].mode == dtq_pb2.FAIL_MODE_RELEASE
    assert worker.stats["released"] == 2 and worker.stats["processed"] == 1
    assert len(fake.lease_requests) == 1  # no reconnect during drain


async def test_drain_grace_over_releases_running_handlers(fake):
    worker = make_worker(fake, concurrency=2, drain_grace_s=0.2)
    started = asyncio.Event()
    cancelled: list[str] = []
    thread_stopped = threading.Event()

    @worker.task("hang")
    async def hang(payload, ctx):
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(ctx.lease_id)
            raise

    @worker.task("hang_sync")
    def hang_sync(payload, ctx):
        ctx.cancelled.wait(10)
        thread_stopped.set()

    task = asyncio.create_task(worker.run_async(install_signal_handlers=False))
    a = await fake.push("hang")
    b = await fake.push("hang_sync")
    await wait_event(started)
    await fake.wait_for(lambda: len(fake.delivered) == 2)
    await fake.wait_for(lambda: any({a, b} <= set(h.lease_ids) for h in fake.heartbeats))
    worker.stop()
    await asyncio.wait_for(task, 5)
    assert cancelled == [a]
    assert {fake.failed()[x].mode for x in (a, b)} == {dtq_pb2.FAIL_MODE_RELEASE}
    assert await asyncio.to_thread(thread_stopped.wait, 5)


async def test_second_stop_cuts_the_grace_period_short(fake):
    worker = make_worker(fake, drain_grace_s=60)
    started = asyncio.Event()

    @worker.task("hang")
    async def hang(payload, ctx):
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(worker.run_async(install_signal_handlers=False))
    lease = await fake.push("hang")
    await wait_event(started)
    worker.stop()
    await fake.wait_for(lambda: fake.open_streams == 0)
    worker.stop()
    await asyncio.wait_for(task, 5)
    assert fake.failed()[lease].mode == dtq_pb2.FAIL_MODE_RELEASE


async def test_stop_from_another_thread(fake):
    worker = make_worker(fake)
    worker.register("t", lambda p, c: None)
    async with running(worker) as task:
        await fake.wait_for(lambda: fake.open_streams == 1)
        await asyncio.to_thread(worker.stop)
        await asyncio.wait_for(asyncio.shield(task), 5)


def test_worker_requires_queues_and_handlers():
    with pytest.raises(ValueError):
        Worker([])
    with pytest.raises(RuntimeError):
        asyncio.run(Worker(["q"]).run_async(install_signal_handlers=False))


@pytest.mark.parametrize(("queues", "says"), [
    ([], "queues: 1..32 queue names (a Lease session's limit), got 0"),
    ([f"q{i}" for i in range(100)], "1..32 queue names (a Lease session's limit), got 100"),
    (["ok", "bad queue!"], "queues: 'bad queue!' is not a queue name"),
    (["x" * 65], "is not a queue name"),
    ("", "queues: '' is not a queue name"),
])
def test_worker_checks_its_queues_when_made(queues, says):
    """What the gateway would refuse at the first Lease (INVALID_ARGUMENT "queues: 1..32")
    is refused by the constructor, naming the parameter."""
    with pytest.raises(ValueError) as err:
        Worker(queues)
    assert says in str(err.value)


def test_worker_takes_one_queue_name_or_up_to_32():
    assert Worker("emails").queues == ["emails"]
    names = [f"q-{i}.v2_x" for i in range(32)]
    assert Worker(iter(names)).queues == names


async def test_cancelling_the_run_tears_down_without_reports(fake):
    worker = make_worker(fake)
    started = asyncio.Event()

    @worker.task("hang")
    async def hang(payload, ctx):
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(worker.run_async(install_signal_handlers=False))
    lease = await fake.push("hang")
    await wait_event(started)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    leftovers = [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("dtq-")]
    assert leftovers == []
    assert lease not in fake.reported()
