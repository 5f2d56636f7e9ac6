"""The dispatcher's periodic tick: one read per empty queue, every session with work fed,
and draining workers' streams ended even when their queues are empty."""

from __future__ import annotations

import itertools

from dtq_gateway.store import keys
from tests.redis.dispatch_support import drained
from tests.redis.test_core_scripts import BY_SLOT


async def test_tick_reads_an_empty_queue_once_for_all_its_sessions(dispatch_env):
    for i in range(50):
        dispatch_env.session(worker_id=f"w{i}")
    await dispatch_env.dispatcher.run_round(tick=True)
    assert dispatch_env.own_reads == 1


async def test_tick_feeds_every_session_while_the_queue_has_work(dispatch_env):
    sessions = [dispatch_env.session(worker_id=f"w{i}", max_in_flight=1) for i in range(3)]
    dispatch_env.broker.read_ahead = None  # leave the tasks for the tick
    tids = {await dispatch_env.enqueue() for _ in range(3)}
    await dispatch_env.dispatcher.run_round(tick=True)
    got = [t.task_id for s in sessions for t in drained(s)]
    assert sorted(got) == sorted(tids) and all(len(drained(s)) == 0 for s in sessions)


async def test_a_read_that_only_put_tasks_back_does_not_mark_the_queue_empty(dispatch_env):
    a = dispatch_env.session(worker_id="wa", task_types=frozenset({"a"}))
    b = dispatch_env.session(worker_id="wb", task_types=frozenset({"b"}))
    dispatch_env.broker.read_ahead = None
    tid = await dispatch_env.enqueue(task_type="b")
    for _ in range(2):  # either session may go first; both rotations must deliver at once
        await dispatch_env.dispatcher.run_round(tick=True)
        if not b.out.empty():
            break
    assert [t.task_id for t in drained(b)] == [tid] and drained(a) == []


@BY_SLOT
async def test_tick_ends_the_streams_of_workers_draining_elsewhere(dispatch_env, read_by_slot):
    draining = [dispatch_env.session(worker_id=f"wd{i}", read_by_slot=read_by_slot)
                for i in range(10)]
    other = dispatch_env.session(worker_id="wo", read_by_slot=read_by_slot)
    # Heartbeat(draining) went to another replica: only the worker records say so
    for s in draining:
        await dispatch_env.redis.hset(keys.worker(s.worker_id), "status", "draining")
    dispatch_env.dispatcher._rr = itertools.count(10)  # the round starts at `other`
    await dispatch_env.dispatcher.run_round(tick=True)
    assert dispatch_env.own_reads == 1  # `other` read the empty queue, the ten were skipped
    for s in draining:
        assert s.closed and s.worker_draining and s.out.get_nowait() is None
    assert not other.closed and other.out.empty()


@BY_SLOT
async def test_stalled_sessions_on_an_empty_queue_cost_one_read_per_tick(dispatch_env,
                                                                        read_by_slot):
    """Lease streams of workers that never heartbeat (stalled: no leases for them) on an
    empty queue: lease_take reports the queue empty whatever the worker state."""
    dispatch_env.dispatcher.reader.stale_after_ms = 10_000  # no worker records here: every worker is stale
    sessions = [dispatch_env.session(worker_id=f"w{i}", read_by_slot=read_by_slot)
                for i in range(20)]
    await dispatch_env.dispatcher.run_round(tick=True)
    assert dispatch_env.own_reads == 1
    assert sum(s.full for s in sessions) == 1  # the one read found its worker stalled
