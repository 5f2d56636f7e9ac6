"""Flow control and result batching: max_in_flight, coalesced Ack/Fail, stale leases."""

from __future__ import annotations

import asyncio

import pytest

from dtq_pyworker import Worker
from tests.worker.helpers import make_worker, poll_until, running, wait_event


def _gated_worker(fake, **kwargs):
    """A worker whose "ok" and "bad" handlers all wait for one gate."""
    worker = make_worker(fake, **kwargs)
    gate = asyncio.Event()

    @worker.task("ok")
    async def ok(payload, ctx):
        await gate.wait()
        return ctx.lease_id

    @worker.task("bad")
    async def bad(payload, ctx):
        await gate.wait()
        raise ValueError("x")

    return worker, gate


async def test_many_results_go_out_in_few_calls(fake):
    worker, gate = _gated_worker(fake, concurrency=250, max_in_flight=400,
                                ack_flush_ms=20)
    async with running(worker):
        ok = [await fake.push("ok") for _ in range(200)]
        bad = [await fake.push("bad") for _ in range(50)]
        await fake.wait_for(lambda: len(fake.delivered) == 250)
        await poll_until(lambda: worker.active_tasks == 250)
        gate.set()
        await fake.wait_for(lambda: set(ok) <= set(fake.acked())
                            and set(bad) <= set(fake.failed()), timeout_s=10)
    assert sum(len(c) for c in fake.ack_calls) == 200
    assert len(fake.ack_calls) <= 3, [len(c) for c in fake.ack_calls]
    assert len(fake.fail_calls) <= 3, [len(c) for c in fake.fail_calls]
    assert worker.stats["processed"] == 200 and worker.stats["failed"] == 50


async def test_a_batch_holds_at_most_256_items(fake):
    worker, gate = _gated_worker(fake, concurrency=600, max_in_flight=1000,
                                ack_flush_ms=1000)
    async with running(worker):
        leases = [await fake.push("ok") for _ in range(600)]
        await fake.wait_for(lambda: len(fake.delivered) == 600)
        await poll_until(lambda: worker.active_tasks == 600)
        gate.set()
        await fake.wait_for(lambda: set(leases) <= set(fake.acked()), timeout_s=10)
    sizes = [len(c) for c in fake.ack_calls]
    assert max(sizes) == 256 and sum(sizes) == 600 and len(sizes) <= 4, sizes


async def test_lone_result_is_sent_without_waiting_for_the_window(fake):
    # nothing else is running, so no other result could join the batch
    worker = make_worker(fake, ack_flush_ms=60_000)
    worker.register("t", lambda p, c: 1)
    async with running(worker):
        lease = await fake.push("t")
        await fake.wait_for(lambda: lease in fake.acked())


async def test_concurrency_and_max_in_flight_respected(fake):
    worker = make_worker(fake, concurrency=2, max_in_flight=5)
    active = 0
    peak = 0
    held_peak = 0
    gate = asyncio.Event()
    both_running = asyncio.Event()

    @worker.task("t")
    async def t(payload, ctx):
        nonlocal active, peak, held_peak
        active += 1
        peak = max(peak, active)
        if active == 2:
            both_running.set()
        held_peak = max(held_peak, len(worker._runtime.held))
        await gate.wait()
        active -= 1

    async with running(worker):
        leases = [await fake.push("t") for _ in range(20)]
        await wait_event(both_running)
        await fake.wait_for(lambda: len(fake.delivered) == 5)
        assert worker.active_tasks == 2
        gate.set()
        await fake.wait_for(lambda: set(leases) <= set(fake.acked()))
    assert fake.lease_requests[0].max_in_flight == 5
    assert peak == 2
    assert held_peak <= 5 and fake.max_outstanding <= 5


async def test_stale_single_item_ack_is_dropped_and_worker_continues(fake):
    worker = make_worker(fake, concurrency=1)
    worker.register("t", lambda p, c: "r")
    async with running(worker):
        stale = await fake.push("t")
        fake.stale.add(stale)
        await fake.wait_for(lambda: any(i.lease_id == stale for c in fake.ack_calls for i in c))
        fresh = await fake.push("t")
        await fake.wait_for(lambda: fresh in fake.acked())
    assert worker.stats["stale"] == 1 and worker.stats["processed"] == 1


async def test_stale_item_in_a_batch_is_dropped(fake):
    worker = make_worker(fake, concurrency=10, ack_flush_ms=200)
    gate = asyncio.Event()

    @worker.task("t")
    async def t(payload, ctx):
        await gate.wait()

    async with running(worker):
        leases = [await fake.push("t") for _ in range(5)]
        fake.stale.add(leases[0])
        await fake.wait_for(lambda: len(fake.delivered) == 5)
        gate.set()
        await fake.wait_for(lambda: sum(map(len, fake.ack_calls)) == 5)
    assert worker.stats["stale"] == 1 and worker.stats["processed"] == 4


async def test_results_retried_while_gateway_unavailable(fake):
    fake.unavailable_results = 2
    worker = make_worker(fake)
    worker.register("t", lambda p, c: "r")
    async with running(worker):
        lease = await fake.push("t")
        await fake.wait_for(lambda: lease in fake.acked())
    assert fake.unavailable_results == 0
    assert worker.stats["processed"] == 1


@pytest.mark.parametrize("batch_delivery", [True, False], ids=["batches", "old-gateway"])
async def test_tasks_arriving_in_batches_run_and_report_one_by_one(fake, batch_delivery):
    fake.batch_delivery = batch_delivery  # False: a gateway that ignores max_batch
    leases = [await fake.push("t") for _ in range(12)]  # waiting before the stream opens
    worker = make_worker(fake, concurrency=4, max_in_flight=8)
    worker.register("t", lambda payload, ctx: ctx.lease_id)
    async with running(worker):
        await fake.wait_for(lambda: set(leases) <= set(fake.acked()))
    assert fake.lease_requests[0].max_batch == 8
    # every task of a message ran with its own context and was acked with its result
    assert fake.acked() == {lease: f'"{lease}"'.encode() for lease in leases}
    assert sum(fake.message_sizes) == 12 and fake.max_outstanding <= 8
    if batch_delivery:
        assert max(fake.message_sizes) > 1 and all(n <= 8 for n in fake.message_sizes)
    else:
        assert fake.message_sizes == [1] * 12
    assert worker.stats["processed"] == 12


@pytest.mark.parametrize("max_in_flight, max_batch", [(1, 1), (8, 8), (256, 256),
                                                      (1000, 256)])
def test_the_worker_asks_for_batches_as_large_as_its_credit(max_in_flight, max_batch):
    worker = Worker(["q"], "127.0.0.1:1", max_in_flight=max_in_flight)
    assert worker.lease_max_batch() == max_batch
