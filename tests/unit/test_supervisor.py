"""Supervisor: restart with capped, jittered backoff; give up on a crash loop or on a
task that may not be restarted; nothing restarts after close()."""

from __future__ import annotations

import asyncio

import pytest

from dtq_gateway.supervisor import Supervisor
from tests.support.leasing import wait_until


class Child:
    """A background task whose runs each end as the test says."""

    def __init__(self) -> None:
        self.starts = 0
        self.release = asyncio.Event()
        self.fail = False

    def start(self) -> asyncio.Task[None]:
        self.starts += 1
        return asyncio.create_task(self.run())

    async def run(self) -> None:
        if self.fail:
            raise RuntimeError("boom")
        await self.release.wait()


async def test_a_task_that_ends_is_restarted_and_one_that_may_not_gives_up() -> None:
    gave_up: list[tuple[str, str]] = []

    async def on_give_up(name: str, why: str) -> None:
        gave_up.append((name, why))

    sup = Supervisor(on_give_up, base_backoff_s=0.01)
    again, once = Child(), Child()
    sup.watch("again", again.start)
    sup.watch("once", once.start, restart=False)
    sup.task("again").cancel()
    await wait_until(lambda: again.starts == 2)
    assert not sup.task("again").done() and sup.healthy
    once.fail = True
    once.release.set()  # returns: a task that may not be restarted ended
    await wait_until(lambda: bool(gave_up))
    assert once.starts == 1 and not sup.healthy
    assert gave_up[0][0] == "once" and "not restarted: returned" in gave_up[0][1]
    sup.close()
    sup.task("again").cancel()


async def test_a_crash_loop_gives_up_after_max_restarts() -> None:
    gave_up: list[str] = []

    async def on_give_up(name: str, why: str) -> None:
        gave_up.append(why)

    sup = Supervisor(on_give_up, base_backoff_s=0.001, max_restarts=3)
    child = Child()
    child.fail = True
    sup.watch("looping", child.start)
    await wait_until(lambda: bool(gave_up))
    assert child.starts == 4  # the first run and three restarts
    assert "failed 4 times" in gave_up[0] and "RuntimeError('boom')" in gave_up[0]


async def test_nothing_restarts_after_close() -> None:
    sup = Supervisor(base_backoff_s=0.001)
    child = Child()
    sup.watch("c", child.start)
    sup.close()
    sup.task("c").cancel()
    await asyncio.gather(sup.task("c"), return_exceptions=True)
    # the supervisor's done callback ran before gather's (registered first): it
    # scheduled no restart
    assert not sup._pending
    assert child.starts == 1 and sup.healthy
    with pytest.raises(RuntimeError, match="stopping"):  # a start racing the stop
        sup.watch("late", child.start)
    assert child.starts == 1


def test_backoff_doubles_is_capped_and_jittered() -> None:
    sup = Supervisor(base_backoff_s=0.1, max_backoff_s=1.0)
    for attempt, base in ((1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (30, 1.0)):
        delays = [sup._backoff_s(attempt) for _ in range(200)]
        assert all(base / 2 <= d <= base for d in delays)
        assert len(set(delays)) > 1


def test_defaults_are_the_documented_ones() -> None:
    """docs/operations.md, "Health": 0.1 s doubling up to 5 s; more than 5 failures
    within 60 s give up."""
    sup = Supervisor()
    assert (sup.base_backoff_s, sup.max_backoff_s, sup.max_restarts, sup.window_s) == \
        (0.1, 5.0, 5, 60.0)


async def test_started_task_finds_the_one_task_a_start_created() -> None:
    from dtq_gateway.supervisor import started_task

    made: list[asyncio.Task[None]] = []

    def start() -> None:  # a component's start() that keeps its task to itself
        made.append(asyncio.create_task(asyncio.sleep(3600)))

    assert started_task(start) is made[0]
    made[0].cancel()
    with pytest.raises(RuntimeError, match="started 0 tasks"):
        started_task(lambda: None)


async def test_a_watched_task_has_a_zero_restart_series_before_its_first_restart() -> None:
    """Prometheus' increase() cannot see a counter series that first appears at 1, so
    the DtqBackgroundTaskRestarts alert would miss each task's first restart unless the
    series exists, at 0, from the moment the task is watched."""
    from prometheus_client import REGISTRY

    def restarts() -> float | None:
        return REGISTRY.get_sample_value("dtq_background_task_restarts_total",
                                         {"task": "zero-series"})

    sup = Supervisor(base_backoff_s=0.01)
    child = Child()
    assert restarts() is None
    sup.watch("zero-series", child.start)
    assert restarts() == 0.0
    sup.task("zero-series").cancel()
    await wait_until(lambda: restarts() == 1.0)
    sup.close()
    child.release.set()
