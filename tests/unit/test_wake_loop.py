"""The dispatcher's WakeLoop stops without cutting a round short: a round's Redis call
may already have leased entries that only the rest of the round hands to the streams
(cancelled there, they would wait for the visibility timeout and spend an attempt)."""

from __future__ import annotations

import asyncio

from dtq_gateway.leasing.wake_loop import WakeLoop


async def test_stop_lets_the_round_in_progress_finish():
    started, reply = asyncio.Event(), asyncio.Event()
    finished: list[bool] = []

    async def round(tick: bool) -> None:
        started.set()
        await reply.wait()  # the Redis reply of the round's read, not yet here
        finished.append(tick)

    loop = WakeLoop(round, tick_s=60)
    loop.start()
    loop.event.set()
    await asyncio.wait_for(started.wait(), 2)
    stopping = asyncio.create_task(loop.stop())
    await asyncio.sleep(0)  # stop() has begun
    reply.set()
    await asyncio.wait_for(stopping, 3)
    assert finished == [False]  # the round ran to its end


async def test_stop_runs_no_new_round():
    rounds: list[bool] = []

    async def round(tick: bool) -> None:
        rounds.append(tick)

    loop = WakeLoop(round, tick_s=60)
    loop.start()
    await loop.stop()
    loop.event.set()
    await asyncio.sleep(0)
    assert rounds == []


async def test_stop_cancels_a_round_that_does_not_finish_in_time(monkeypatch):
    from dtq_gateway.leasing import wake_loop

    monkeypatch.setattr(wake_loop, "STOP_GRACE_S", 0.05)
    cancelled = asyncio.Event()

    async def round(tick: bool) -> None:
        try:
            await asyncio.Event().wait()  # Redis never answers
        except asyncio.CancelledError:
            cancelled.set()
            raise

    loop = WakeLoop(round, tick_s=60)
    loop.start()
    loop.event.set()
    await asyncio.sleep(0.01)
    await asyncio.wait_for(loop.stop(), 3)
    assert cancelled.is_set()
