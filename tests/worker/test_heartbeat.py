"""Heartbeats: held lease ids, counters, lost leases, cancellation."""

from __future__ import annotations

import asyncio
import logging
import threading

from dtq_proto import dtq_pb2
from tests.worker.helpers import make_worker, poll_until, running, wait_event


def _blocking_worker(fake, **kwargs):
    """A worker whose "block" handler waits for ``release`` and records events."""
    worker = make_worker(fake, **kwargs)
    state = {"started": [], "cancelled": [], "release": asyncio.Event(),
             "any_started": asyncio.Event(), "any_cancelled": asyncio.Event()}

    @worker.task("block")
    async def block(payload, ctx):
        state["started"].append(ctx.lease_id)
        state["any_started"].set()
        try:
            await state["release"].wait()
        except asyncio.CancelledError:
            state["cancelled"].append(ctx.lease_id)
            state["any_cancelled"].set()
            raise
        return "done"

    return worker, state


async def test_heartbeat_lists_running_and_buffered_leases_with_counters(fake):
    worker, state = _blocking_worker(fake, concurrency=1, max_in_flight=3)
    worker.register("quick", lambda p, c: 1)
    async with running(worker):
        quick = await fake.push("quick")
        await fake.wait_for(lambda: quick in fake.acked())
        a = await fake.push("block")
        b = await fake.push("block")
        await fake.wait_for(lambda: any({a, b} <= set(h.lease_ids) for h in fake.heartbeats))
        hb = next(h for h in fake.heartbeats if {a, b} <= set(h.lease_ids))
        assert state["started"] == [a]  # b is buffered, yet heartbeated
        assert hb.worker_id == "w-test" and hb.concurrency == 1 and hb.active_tasks == 1
        assert hb.counters.tasks_processed == 1
        state["release"].set()
        await fake.wait_for(lambda: {a, b} <= set(fake.acked()))


async def test_cancel_running_async_handler_reports_cancelled(fake):
    worker, state = _blocking_worker(fake)
    async with running(worker):
        lease = await fake.push("block")
        await wait_event(state["any_started"])
        fake.cancelled.add(lease)
        await fake.wait_for(lambda: lease in fake.failed())
    item = fake.failed()[lease]
    assert item.mode == dtq_pb2.FAIL_MODE_CANCELLED
    assert state["cancelled"] == [lease]
    assert lease not in fake.acked()
    assert worker.stats["cancelled"] == 1 and worker.stats["failed"] == 0


async def test_cancel_running_sync_handlers_warns_only_for_the_one_still_running(fake, caplog):
    caplog.set_level(logging.INFO, logger="dtq_pyworker._runtime")
    worker = make_worker(fake, concurrency=2)
    let_go = threading.Event()

    @worker.task("polls")
    def polls(payload, ctx):  # stops cooperatively
        ctx.cancelled.wait(10)
        return "stopped"

    @worker.task("ignores")
    def ignores(payload, ctx):  # never looks at ctx.cancelled
        let_go.wait(10)
        return "late"

    def lines(message: str) -> list[str]:
        return [r.lease_id for r in caplog.records if message in r.getMessage()]

    stuck, freed = "still running in its thread", "slot free again"
    async with running(worker):
        try:
            polite = await fake.push("polls")
            rude = await fake.push("ignores")
            await poll_until(lambda: worker.threads_busy == 2)
            fake.cancelled.update({polite, rude})
            # both end CANCELLED at once, the one that never looks included ...
            await fake.wait_for(lambda: {polite, rude} <= set(fake.failed()))
            # ... which runs on in its thread, holding its slot, and is warned about once
            # the grace (stuck_warn_s) is over; the polite one's warning never comes
            await poll_until(lambda: lines(stuck) == [rude], 10)
            runtime = worker._runtime
            assert runtime.stuck_threads() == 1 and runtime.busy_slots() == 1
            assert not runtime._stuck_timers and lines(freed) == []
            let_go.set()
            await poll_until(lambda: lines(freed) == [rude])
        finally:
            let_go.set()  # a failed check must not leave the thread hanging
    assert {fake.failed()[i].mode for i in (polite, rude)} == {dtq_pb2.FAIL_MODE_CANCELLED}
    assert rude not in fake.acked() and worker.stats["cancelled"] == 2
    assert lines(stuck) == [rude]


async def test_cancel_buffered_task_never_runs(fake):
    worker, state = _blocking_worker(fake, concurrency=1, max_in_flight=2)
    async with running(worker):
        first = await fake.push("block")
        second = await fake.push("block")
        await wait_event(state["any_started"])
        await fake.wait_for(lambda: len(fake.delivered) == 2)
        fake.cancelled.add(second)
        await fake.wait_for(lambda: second in fake.failed())
        state["release"].set()
        await fake.wait_for(lambda: first in fake.acked())
    assert fake.failed()[second].mode == dtq_pb2.FAIL_MODE_CANCELLED
    assert state["started"] == [first]


async def test_lost_lease_stops_handler_and_is_never_reported(fake):
    worker, state = _blocking_worker(fake)
    async with running(worker):
        lease = await fake.push("block")
        await wait_event(state["any_started"])
        fake.lost.add(lease)
        await wait_event(state["any_cancelled"])
        seen = len(fake.heartbeats)
        # two more heartbeats: the lease is no longer listed, nothing was reported
        await fake.wait_for(lambda: len(fake.heartbeats) >= seen + 2)
        assert lease not in fake.heartbeats[-1].lease_ids
    assert lease not in fake.reported()
    assert worker.stats["lost"] == 1


async def test_lost_buffered_lease_never_runs(fake):
    worker, state = _blocking_worker(fake, concurrency=1, max_in_flight=2)
    async with running(worker):
        first = await fake.push("block")
        second = await fake.push("block")
        await wait_event(state["any_started"])
        await fake.wait_for(lambda: len(fake.delivered) == 2)
        told = len(fake.heartbeats)  # the heartbeats from here on are answered "lost"
        fake.lost.add(second)
        await fake.wait_for(lambda: any(second in h.lease_ids for h in fake.heartbeats[told:]))
        seen = len(fake.heartbeats)
        await fake.wait_for(lambda: len(fake.heartbeats) >= seen + 1)
        assert second not in fake.heartbeats[-1].lease_ids
        state["release"].set()
        await fake.wait_for(lambda: first in fake.acked())
    assert state["started"] == [first]
    assert second not in fake.reported()


async def test_failed_heartbeats_are_retried_and_leases_kept(fake):
    worker, state = _blocking_worker(fake)
    async with running(worker):
        lease = await fake.push("block")
        await wait_event(state["any_started"])
        fake.unavailable_heartbeats = 3
        await fake.wait_for(lambda: fake.failed_heartbeats == 3)
        seen = len(fake.heartbeats)
        await fake.wait_for(lambda: len(fake.heartbeats) > seen)
        assert lease in fake.heartbeats[-1].lease_ids
        state["release"].set()
        await fake.wait_for(lambda: lease in fake.acked())
    assert state["cancelled"] == []


async def test_unsent_result_of_a_lost_lease_is_sent_and_counted_by_the_answer(fake):
    worker, state = _blocking_worker(fake, concurrency=2, ack_flush_ms=60_000)
    worker.register("quick", lambda p, c: "late")
    async with running(worker):
        blocker = await fake.push("block")
        await wait_event(state["any_started"])
        quick = await fake.push("quick")
        # its result waits in the batch (a handler still runs, the window is long)
        await fake.wait_for(lambda: any(quick in h.lease_ids for h in fake.heartbeats)
                            and quick not in worker._runtime.held)
        fake.lost.add(quick)
        fake.stale.add(quick)  # really lost: the gateway fences its result
        seen = len(fake.heartbeats)
        await fake.wait_for(lambda: len(fake.heartbeats) >= seen + 2)
        assert quick in fake.heartbeats[-1].lease_ids  # kept until answered
        assert quick not in _sent_acks(fake)
        state["release"].set()
        await fake.wait_for(lambda: {blocker, quick} <= _sent_acks(fake))
    assert quick not in fake.acked()  # answered STALE_LEASE
    assert (worker.stats["processed"], worker.stats["stale"]) == (1, 1)


async def test_fail_applied_before_its_lease_was_reported_lost_counts_by_the_answer(fake):
    worker, state = _blocking_worker(fake, concurrency=2, ack_flush_ms=60_000)

    @worker.task("broken")
    def broken(payload, ctx):
        raise ValueError("boom")

    async with running(worker):
        blocker = await fake.push("block")
        await wait_event(state["any_started"])
        failing = await fake.push("broken")
        await fake.wait_for(lambda: any(failing in h.lease_ids for h in fake.heartbeats)
                            and failing not in worker._runtime.held)
        # the gateway had applied this Fail (its reply was lost): the lease is lost and
        # the resend is a duplicate; the retry it scheduled is already leased again
        fake.lost.add(failing)
        fake.duplicates[failing] = dtq_pb2.TASK_STATUS_ACTIVE
        seen = len(fake.heartbeats)
        await fake.wait_for(lambda: len(fake.heartbeats) >= seen + 2)
        state["release"].set()
        await fake.wait_for(lambda: failing in fake.failed() and blocker in fake.acked())
    assert fake.failed()[failing].error_class == "ValueError"
    assert (worker.stats["failed"], worker.stats["retried"], worker.stats["stale"]) == (1, 1, 0)


def _sent_acks(fake) -> set[str]:
    """Lease ids of every Ack item the fake received, whatever its answer."""
    return {i.lease_id for call in fake.ack_calls for i in call}


async def test_progress_rides_on_heartbeats_latest_once(fake):
    worker = make_worker(fake, concurrency=1)
    release, reported = asyncio.Event(), asyncio.Event()

    @worker.task("steps")
    async def steps(payload, ctx):
        for pct in (10, 20, 30):
            ctx.progress(pct, f"step {pct}")
        reported.set()
        await release.wait()

    async with running(worker):
        lease = await fake.push("steps")
        await wait_event(reported)
        await fake.wait_for(lambda: any(h.progress for h in fake.heartbeats))
        sent = [p for h in fake.heartbeats for p in h.progress]
        assert [(p.lease_id, p.percent, p.message) for p in sent] == [(lease, 30, "step 30")]
        beats = len(fake.heartbeats)
        await fake.wait_for(lambda: len(fake.heartbeats) > beats + 1)
        assert len([p for h in fake.heartbeats for p in h.progress]) == 1  # sent once
        release.set()
        await fake.wait_for(lambda: lease in fake.acked())
