"""Drain with the draining heartbeat: read the Lease stream to its end, release the rest."""

from __future__ import annotations

import asyncio

from dtq_proto import dtq_pb2
from dtq_pyworker import AsyncClient, Worker
from dtq_pyworker.worker import DRAIN_STREAM_MIN_S
from tests.worker.helpers import make_worker, poll_until, wait_event


def _blocking_worker(worker: Worker) -> tuple[list[str], asyncio.Event, asyncio.Event]:
    started: list[str] = []
    first, release = asyncio.Event(), asyncio.Event()

    @worker.task("t")
    async def t(payload, ctx):
        started.append(ctx.lease_id)
        first.set()
        await release.wait()
        return "done"

    return started, first, release


async def test_drain_sends_draining_heartbeats_and_releases_tasks_in_transit(fake):
    worker = make_worker(fake, concurrency=1, max_in_flight=2, drain_grace_s=10)
    started, first, release = _blocking_worker(worker)
    task = asyncio.create_task(worker.run_async(install_signal_handlers=False))
    running_lease = await fake.push("t")
    await wait_event(first)
    in_transit = fake.in_transit_task("t")  # written only after the draining heartbeat
    stop_at = asyncio.get_running_loop().time()
    worker.stop()
    await fake.wait_for(lambda: in_transit in fake.failed() and fake.open_streams == 0)
    # the stream ended on the gateway's OK, well before the bounded wait
    assert asyncio.get_running_loop().time() - stop_at < DRAIN_STREAM_MIN_S
    draining = [h for h in fake.heartbeats if h.draining]
    assert draining and running_lease in draining[0].lease_ids
    seen = len(fake.heartbeats)
    await fake.wait_for(lambda: len(fake.heartbeats) > seen + 1)  # later ones say it again
    release.set()
    await asyncio.wait_for(task, 10)
    first_draining = fake.heartbeats.index(draining[0])
    assert all(h.draining for h in fake.heartbeats[first_draining:])
    assert not any(h.draining for h in fake.heartbeats[:first_draining])
    assert started == [running_lease]  # the task in transit never ran
    assert fake.failed()[in_transit].mode == dtq_pb2.FAIL_MODE_RELEASE
    assert fake.acked()[running_lease] == b'"done"'
    assert worker.stats["released"] == 1 and worker.stats["processed"] == 1
    assert len(fake.lease_requests) == 1  # no reconnect after the stream ended


async def test_drain_against_a_gateway_without_draining_is_bounded(fake):
    fake.honor_draining = False  # an older gateway: the stream never ends by itself
    worker = make_worker(fake, concurrency=1, max_in_flight=3, drain_grace_s=10)
    _started, _first, release = _blocking_worker(worker)
    release.set()
    task = asyncio.create_task(worker.run_async(install_signal_handlers=False))
    lease = await fake.push("t")
    await fake.wait_for(lambda: lease in fake.acked())
    stop_at = asyncio.get_running_loop().time()
    worker.stop()
    await asyncio.wait_for(task, DRAIN_STREAM_MIN_S + 3)
    waited = asyncio.get_running_loop().time() - stop_at
    assert DRAIN_STREAM_MIN_S - 0.1 <= waited < DRAIN_STREAM_MIN_S + 3
    assert any(h.draining for h in fake.heartbeats)
    await fake.wait_for(lambda: fake.open_streams == 0)  # the worker cancelled it
    assert len(fake.lease_requests) == 1


async def test_payload_bytes_are_the_enqueued_bytes(fake):
    worker = make_worker(fake)
    seen: list[bytes] = []

    @worker.task("raw")
    def raw(payload, ctx):
        seen.append(ctx.payload_bytes)
        return ctx.payload_bytes

    task = asyncio.create_task(worker.run_async(install_signal_handlers=False))
    body = b'{"b": 1,  "a": "\\u00e9"}'  # not what re-encoding the JSON would give
    lease = await fake.push("raw", body)
    await fake.wait_for(lambda: lease in fake.acked())
    worker.stop()
    await asyncio.wait_for(task, 10)
    assert seen == [body] and fake.acked()[lease] == body


async def test_drain_with_the_gateway_releases_without_spending_attempts(gateway):
    target = f"127.0.0.1:{gateway.port}"
    worker = Worker(["drain"], target, worker_id="w-drain", concurrency=1, max_in_flight=4,
                    drain_grace_s=10)
    started, first, release = _blocking_worker(worker)
    async with AsyncClient(target) as client:
        ids = [(await client.enqueue("drain", "t", {"n": i})).task_id for i in range(4)]
        task = asyncio.create_task(worker.run_async(install_signal_handlers=False))
        await wait_event(first, 10)
        await poll_until(lambda: worker._runtime is not None
                         and len(worker._runtime.held) == 4, timeout_s=10)
        worker.stop()
        await poll_until(lambda: worker._state is not None and not worker._state.stream_open,
                         timeout_s=5)
        late = (await client.enqueue("drain", "t", {"late": True})).task_id  # after the drain
        release.set()
        await asyncio.wait_for(task, 15)
        assert len(started) == 1 and worker.stats["processed"] == 1
        assert worker.stats["released"] == 3
        tasks = [(await client.get_task(t)) for t in ids + [late]]
        assert sum(t.status == dtq_pb2.TASK_STATUS_SUCCEEDED for t in tasks) == 1
        assert all(t.status == dtq_pb2.TASK_STATUS_QUEUED for t in tasks
                   if t.status != dtq_pb2.TASK_STATUS_SUCCEEDED), tasks
        # a second worker runs the released ones: none spent an attempt
        second = Worker(["drain"], target, worker_id="w-after", drain_grace_s=5)
        second.register("t", lambda p, c: "again")
        run2 = asyncio.create_task(second.run_async(install_signal_handlers=False))
        try:
            done = [await client.wait(t, 20) for t in ids + [late]]
        finally:
            second.stop()
            await asyncio.wait_for(run2, 10)
    assert all(t.status == dtq_pb2.TASK_STATUS_SUCCEEDED for t in done)
    assert all(t.attempt == 1 for t in done), [(t.task_id, t.attempt) for t in done]
    assert all([a.outcome for a in t.attempts].count("succeeded") == 1 for t in done)



async def test_drain_without_a_session_does_not_wait_for_a_stream_end():
    """A Lease call without SessionInfo (the gateway unreachable, restarting, or not
    answering yet) carries no lease: a stop does not sit out the bounded wait for a
    stream end (two heartbeat intervals: 20 s after a real gateway's 10 s SessionInfo)
    and returns at once."""
    from tests.worker.fake_broker import FakeBroker, start_server

    class Mute(FakeBroker):
        async def Lease(self, request, context):  # never answers
            self.lease_requests.append(request)
            await self.notify()
            await asyncio.Event().wait()
            yield  # pragma: no cover

    broker = Mute()
    server, broker.target = await start_server(broker)
    try:
        worker = make_worker(broker, drain_grace_s=10)
        _blocking_worker(worker)
        task = asyncio.create_task(worker.run_async(install_signal_handlers=False))
        await broker.wait_for(lambda: len(broker.lease_requests) == 1)
        stop_at = asyncio.get_running_loop().time()
        worker.stop()
        await asyncio.wait_for(task, DRAIN_STREAM_MIN_S + 3)
        assert asyncio.get_running_loop().time() - stop_at < DRAIN_STREAM_MIN_S
    finally:
        await server.stop(None)
