"""The worker and clients against the real in-process gateway and a private Redis."""

from __future__ import annotations

import asyncio
import json
import logging
import threading

import grpc
import pytest

from dtq_proto import dtq_pb2, dtq_pb2_grpc
from dtq_pyworker import AsyncClient, PermanentError, Retry, TaskFailed, TaskStatus, Worker
from tests.worker.helpers import poll_until, running, wait_event

POLL_S = 0.02  # GetTask poll interval, bounded by each wait's deadline


def _worker(gateway, **kwargs) -> Worker:
    kwargs.setdefault("worker_id", "w-e2e")
    kwargs.setdefault("drain_grace_s", 5)
    return Worker(["e2e"], f"127.0.0.1:{gateway.port}", **kwargs)


async def test_success_retry_and_dead_letter_end_to_end(gateway):
    worker = _worker(gateway)

    @worker.task("ok")
    def ok(payload, ctx):
        return {"double": payload["n"] * 2}

    @worker.task("later")
    async def later(payload, ctx):
        raise Retry(after_s=30)

    @worker.task("corrupt")
    def corrupt(payload, ctx):
        raise PermanentError("bad input")

    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client, running(worker):
        ok_id = (await client.enqueue("e2e", "ok", {"n": 21})).task_id
        later_id = (await client.enqueue("e2e", "later", {}, max_attempts=3)).task_id
        bad_id = (await client.enqueue("e2e", "corrupt", {}, max_attempts=5)).task_id
        done = await client.wait(ok_id, 20)
        with pytest.raises(TaskFailed) as failed:
            await client.wait(bad_id, 20)
        scheduled = await _poll_task(client, later_id, lambda t: len(t.attempts) == 1
                                     and t.status == dtq_pb2.TASK_STATUS_SCHEDULED)
    assert done.status is TaskStatus.SUCCEEDED
    assert done.result == {"double": 42} and json.loads(done.result_bytes) == {"double": 42}
    dead = failed.value.task
    assert dead.status is TaskStatus.DEAD_LETTERED
    assert (failed.value.error_class, failed.value.error) == ("PermanentError", "bad input")
    assert (dead.last_error_class, len(dead.attempts)) == ("PermanentError", 1)
    assert scheduled.last_error_class == "Retry"
    delay_ms = scheduled.due_at_ms - scheduled.attempts[0].finished_at_ms
    assert 29_000 <= delay_ms <= 31_000  # retry_after wins over the backoff
    assert worker.stats["processed"] == 1 and worker.stats["failed"] == 2
    assert worker.stats["retried"] == 1


async def _poll_task(client, task_id, predicate, timeout_s=10.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        task = await client.get_task(task_id)
        if predicate(task):
            return task
        assert asyncio.get_running_loop().time() < deadline, task
        await asyncio.sleep(POLL_S)


async def test_cancel_running_task_end_to_end(gateway):
    worker = _worker(gateway)
    started, stopped = asyncio.Event(), asyncio.Event()

    @worker.task("long")
    async def long(payload, ctx):
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()

    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client, running(worker):
        task_id = (await client.enqueue("e2e", "long", {})).task_id
        await wait_event(started, 10)
        resp = await client.cancel(task_id, reason="test")
        assert resp.cancel_requested
        await wait_event(stopped, 10)
        task = await client.wait(task_id, 10, raise_on_failure=False)
    assert task.status == dtq_pb2.TASK_STATUS_CANCELLED
    assert worker.stats["cancelled"] == 1


async def test_drain_hands_tasks_back_without_spending_attempts(gateway):
    worker = _worker(gateway, concurrency=1, max_in_flight=2, drain_grace_s=0.2)
    started = asyncio.Event()

    @worker.task("long")
    async def long(payload, ctx):
        started.set()
        await asyncio.Event().wait()

    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client:
        ids = [(await client.enqueue("e2e", "long", {})).task_id for _ in range(2)]
        task = asyncio.create_task(worker.run_async(install_signal_handlers=False))
        await wait_event(started, 10)
        # both leases reached the worker (one running, one buffered)
        await poll_until(lambda: len(worker._runtime.held) == 2, 10)
        worker.stop()
        await asyncio.wait_for(task, 10)
        tasks = [await client.get_task(t) for t in ids]
    assert [t.status for t in tasks] == [dtq_pb2.TASK_STATUS_QUEUED] * 2
    assert [t.attempt for t in tasks] == [1, 1]
    assert worker.stats["released"] == 2


async def test_worker_survives_gateway_restart(redis_url):
    from dtq_gateway.server import Gateway
    from tests.conftest import gateway_settings

    first = Gateway(gateway_settings(redis_url), redis_url)
    await first.start()
    port = first.port
    worker = _worker(first)
    started, release = asyncio.Event(), asyncio.Event()

    @worker.task("block")
    async def block(payload, ctx):
        started.set()
        await release.wait()
        return "after restart"

    second = None
    try:
        async with AsyncClient(f"127.0.0.1:{port}") as client, running(worker):
            task_id = (await client.enqueue("e2e", "block", {})).task_id
            await wait_event(started, 10)
            await first.stop()  # ends the Lease stream with UNAVAILABLE
            second = Gateway(gateway_settings(redis_url, listen=f"127.0.0.1:{port}"), redis_url)
            await second.start()
            release.set()
            task = await client.wait(task_id, 20)
            assert task.status == dtq_pb2.TASK_STATUS_SUCCEEDED
            assert task.result == "after restart"
            assert [a.outcome for a in task.attempts] == ["succeeded"]
            fresh = (await client.enqueue("e2e", "block", {})).task_id
            assert (await client.wait(fresh, 20)).status == dtq_pb2.TASK_STATUS_SUCCEEDED
        assert worker.stats["reconnects"] >= 1
    finally:
        if second is not None:
            await second.stop()


async def test_hung_sync_handler_keeps_its_slot_and_times_out_once(gateway, caplog):
    caplog.set_level(logging.INFO, logger="dtq_pyworker._runtime")
    worker = _worker(gateway, concurrency=1)
    ran: list[int] = []
    unhang = threading.Event()

    @worker.task("hang")
    def hang(payload, ctx):  # ignores its 1 s time limit and ctx.cancelled until let go
        unhang.wait(30)
        return "late"

    @worker.task("quick")
    def quick(payload, ctx):
        ran.append(payload["n"])
        return payload["n"]

    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client, running(worker):
        try:
            hung = (await client.enqueue("e2e", "hang", {}, timeout_ms=1000, max_attempts=1,
                                         priority=9)).task_id
            await poll_until(lambda: worker.threads_busy == 1, 10)
            quick_ids = [(await client.enqueue("e2e", "quick", {"n": n}, timeout_ms=1000,
                                               max_attempts=1)).task_id for n in range(4)]
            dead = await client.wait(hung, 10, raise_on_failure=False)
            # past its limit the hung thread still holds the only slot: nothing starts,
            # and the heartbeat reports the slot as taken
            await poll_until(lambda: worker._runtime.stuck_threads() == 1, 5)
            assert ran == [] and worker._runtime.busy_slots() == 1
            # still in its thread once the grace after the stop is over: warned about
            await poll_until(lambda: _logged(caplog, "slot stays taken"), 5)
            assert not _logged(caplog, "slot free again")
            unhang.set()  # the thread ends at last: its slot is free again
            done = [await client.wait(t, 10) for t in quick_ids]
            await poll_until(lambda: worker.threads_busy == 0, 5)
        finally:
            unhang.set()  # a failed check must not leave the thread hanging
    assert (dead.status, dead.last_error_class) == (dtq_pb2.TASK_STATUS_DEAD_LETTERED,
                                                    "Timeout")
    assert [a.outcome for a in dead.attempts] == ["failed"]  # reported once
    assert [t.status for t in done] == [dtq_pb2.TASK_STATUS_SUCCEEDED] * 4
    assert sorted(ran) == [0, 1, 2, 3] and worker.stats["timeouts"] == 1
    assert _logged(caplog, "slot free again")


def _logged(caplog, text: str) -> bool:
    return any(text in r.getMessage() for r in caplog.records)


def _unavailable(details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(),
                                grpc.aio.Metadata(), details=details)


class _AcksCutOff(grpc.aio.UnaryUnaryClientInterceptor):
    """Sits in the worker's channel and plays a gateway that stops answering Ack calls.

    Every Ack call fails with UNAVAILABLE (without reaching the gateway) until the
    worker has handled a Heartbeat answer that reported a lease lost: the gate opens
    when the Heartbeat call after that one begins, so the worker's resend can only come
    after it acted on the lost lease (the order a gateway killed under load produced).

    Args:
        apply_first: The first Ack call does reach the gateway, which applies it; only
            its reply is lost (the client sees UNAVAILABLE). ``applied`` keeps it.
        cut_beats: From the first Ack call on, Heartbeat calls fail with UNAVAILABLE
            too, until the test sets ``beats_pass`` (the leases then expire).
    """

    def __init__(self, *, apply_first: bool = False, cut_beats: bool = False) -> None:
        self.apply_first = apply_first
        self.cut_beats = cut_beats
        self.applied: list[dtq_pb2.AckResponse] = []  # answers the worker never saw
        self.refused_acks = 0
        self.beats_pass = True
        self.lost_reported = False
        self.acks_pass = False

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        method = client_call_details.method
        method = method.decode() if isinstance(method, bytes) else method
        if method == "/dtq.v1.Broker/Heartbeat":
            if not self.beats_pass:
                raise _unavailable("gateway unreachable (test)")
            if self.lost_reported:  # the worker handled that answer before this call
                self.acks_pass = True
            response = await (await continuation(client_call_details, request))
            self.lost_reported = self.lost_reported or bool(response.lost_lease_ids)
            return response
        if method == "/dtq.v1.Broker/Ack" and not self.acks_pass:
            if self.cut_beats and self.refused_acks == 0:
                self.beats_pass = False
            if self.apply_first and not self.applied:
                self.applied.append(await (await continuation(client_call_details, request)))
            self.refused_acks += 1
            raise _unavailable("reply lost (test)")
        return await continuation(client_call_details, request)


def _cut_acks(monkeypatch, interceptor: _AcksCutOff) -> None:
    """Put ``interceptor`` into every grpc.aio channel made from now on (the worker's;
    the test's clients make no Ack or Heartbeat calls)."""
    plain = grpc.aio.insecure_channel

    def channel(target, options=None, compression=None, interceptors=None):
        return plain(target, options=options, compression=compression,
                     interceptors=[*(interceptors or []), interceptor])

    monkeypatch.setattr(grpc.aio, "insecure_channel", channel)


async def test_ack_applied_but_reply_lost_is_counted_once(gateway, channel, monkeypatch):
    cut = _AcksCutOff(apply_first=True)
    _cut_acks(monkeypatch, cut)
    worker = _worker(gateway)

    @worker.task("ok")
    def ok(payload, ctx):
        return payload["n"] + 1

    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client, running(worker):
        task_id = (await client.enqueue("e2e", "ok", {"n": 41})).task_id
        # the gateway applied the first Ack; the worker saw UNAVAILABLE, then a heartbeat
        # reported the lease lost (its task had ended) while the result was still unsent
        await poll_until(lambda: cut.acks_pass, 15)
        await poll_until(lambda: worker.stats["processed"] == 1, 15)
        task = await client.get_task(task_id)
        stats = await dtq_pb2_grpc.AdminStub(channel).GetQueueStats(
            dtq_pb2.GetQueueStatsRequest(queue="e2e"))
    [applied] = cut.applied
    assert not applied.results[0].HasField("error") and not applied.results[0].duplicate
    assert cut.refused_acks >= 1
    assert (task.status, task.result) == (TaskStatus.SUCCEEDED, 42)
    assert [a.outcome for a in task.attempts] == ["succeeded"]
    assert stats.succeeded == 1  # applied once: the resend was answered as a duplicate
    assert (worker.stats["processed"], worker.stats["stale"], worker.stats["lost"]) == (1, 0, 0)


async def test_result_of_a_reclaimed_lease_is_counted_stale_and_changes_nothing(
        gateway, monkeypatch):
    cut = _AcksCutOff(cut_beats=True)
    _cut_acks(monkeypatch, cut)
    worker = _worker(gateway)
    runs: list[int] = []

    @worker.task("ok")
    def ok(payload, ctx):
        runs.append(ctx.attempt)
        return f"attempt {ctx.attempt}"

    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client, running(worker):
        task_id = (await client.enqueue("e2e", "ok", {}, max_attempts=3)).task_id
        # no Ack and no Heartbeat gets through: the lease expires and the reaper
        # hands the task out again as attempt 2 while the first result is unsent
        await _poll_task(client, task_id, lambda t: t.attempt >= 2, 15)
        cut.beats_pass = True
        await poll_until(lambda: worker.stats["stale"] == 1, 15)
        task = await client.wait(task_id, 15)
    assert runs[0] == 1 and cut.refused_acks >= 1
    assert task.status == dtq_pb2.TASK_STATUS_SUCCEEDED and task.result == "attempt 2"
    assert [a.outcome for a in task.attempts] == ["lease_expired", "succeeded"]
    # attempt 1's result was answered STALE_LEASE; this worker counts as processed only
    # the later attempts it ran itself (the re-leased task may have come back to it)
    assert worker.stats["processed"] == len([a for a in runs if a >= 2])
