"""Read-ahead: a unary enqueue carries a lease_take for an idle session in its round trip.

The dispatcher loop is not running here; each test drives one round by hand, and
counts the dispatcher's own lease_take round trips through ``Dispatcher.lease_now``.
"""

from __future__ import annotations

import pytest

from dtq_gateway.store import keys
from tests.redis.dispatch_support import drained
from tests.redis.test_core_scripts import BY_SLOT


@BY_SLOT
async def test_enqueue_reads_for_an_idle_session_in_the_same_round_trip(dispatch_env,
                                                                       read_by_slot):
    s = dispatch_env.session(read_by_slot=read_by_slot)
    tid = await dispatch_env.enqueue()
    assert s.reading and len(dispatch_env.dispatcher._reads) == 1
    assert not dispatch_env.dispatcher._dirty_queues  # no wake-up for a second read
    await dispatch_env.dispatcher.run_round(tick=False)
    assert [t.task_id for t in drained(s)] == [tid]
    assert dispatch_env.own_reads == 0 and not s.reading
    assert await dispatch_env.status(tid) == "active"


async def test_sessions_take_turns(dispatch_env):
    a, b = dispatch_env.session(worker_id="wa"), dispatch_env.session(worker_id="wb")
    first = await dispatch_env.enqueue()
    second = await dispatch_env.enqueue()  # `a` still has its read in flight
    await dispatch_env.dispatcher.run_round(tick=False)
    assert [t.task_id for t in drained(a)] == [first]
    assert [t.task_id for t in drained(b)] == [second]
    assert dispatch_env.own_reads == 0


async def test_a_session_filtering_for_the_task_type_reads_ahead(dispatch_env):
    s = dispatch_env.session(task_types=frozenset({"t", "u"}))
    tid = await dispatch_env.enqueue(task_type="t")
    await dispatch_env.dispatcher.run_round(tick=False)
    assert [t.task_id for t in drained(s)] == [tid] and dispatch_env.own_reads == 0


@pytest.mark.parametrize("kind", ["full", "filtered", "closed"])
async def test_no_read_ahead_for_a_session_that_cannot_take_the_task(dispatch_env, kind):
    s = dispatch_env.session(task_types=frozenset({"other"}) if kind == "filtered" else frozenset())
    s.full = kind == "full"
    s.closed = kind == "closed"
    await dispatch_env.enqueue()
    assert dispatch_env.dispatcher._reads == [] and not s.reading
    assert dispatch_env.dispatcher._dirty_queues == {"q"}  # the normal wake-up instead


async def test_delayed_task_is_not_read_ahead(dispatch_env):
    s = dispatch_env.session()
    tid = await dispatch_env.enqueue(delay_ms=60_000)
    assert dispatch_env.dispatcher._reads == [] and not s.reading
    assert await dispatch_env.status(tid) == "scheduled"


async def test_empty_read_ahead_wakes_a_normal_round(dispatch_env):
    s = dispatch_env.session()
    await dispatch_env.redis.set(keys.paused("q"), "1")
    tid = await dispatch_env.enqueue()
    await dispatch_env.dispatcher.run_round(tick=False)
    assert drained(s) == [] and dispatch_env.own_reads == 1  # the round looked again itself
    await dispatch_env.redis.delete(keys.paused("q"))
    dispatch_env.dispatcher.notify("q")
    await dispatch_env.dispatcher.run_round(tick=False)
    assert [t.task_id for t in drained(s)] == [tid]


async def test_cancelled_read_ahead_falls_back_to_the_wake_up(dispatch_env):
    s = dispatch_env.session()
    ahead = dispatch_env.dispatcher.read_ahead("q", "t")
    assert ahead is not None and s.reading
    ahead.cancel()
    assert not s.reading and dispatch_env.dispatcher._dirty_queues == {"q"}


async def test_a_failed_activation_strands_no_session(dispatch_env):
    """If activating one read-ahead fails (Redis gone mid-round), every session whose
    read was pending can read ahead again (its entries are the reaper's, as for any
    read that was never activated)."""
    a, b = dispatch_env.session(worker_id="wa"), dispatch_env.session(worker_id="wb")
    await dispatch_env.enqueue()
    await dispatch_env.enqueue()
    assert a.reading and b.reading

    async def broken(session, reply):
        raise ConnectionError("redis went away")
    dispatch_env.dispatcher._after_read = broken
    with pytest.raises(ConnectionError):
        await dispatch_env.dispatcher.run_round(tick=False)
    assert not a.reading and not b.reading
