"""Read-ahead: a unary enqueue carries a lease_read for an idle session in its round trip.

The dispatcher loop is not running here; each test drives one round by hand, and
counts the dispatcher's own lease_read round trips through ``Dispatcher._lease``.
"""

from __future__ import annotations

import pytest

from dtq_gateway import keys
from dtq_gateway.sessions import Session
from tests.redis.test_core_scripts import Env


class ReadAheadEnv(Env):
    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.broker.on_queued = self.dispatcher.notify
        self.broker.read_ahead = self.dispatcher.read_ahead
        self.own_reads = 0
        lease = self.dispatcher._lease

        async def counted(session):
            self.own_reads += 1
            return await lease(session)
        self.dispatcher._lease = counted

    def session(self, **kw) -> Session:
        s = Session(worker_id=kw.pop("worker_id", "w1"), queues=kw.pop("queues", ["q"]),
                    max_in_flight=kw.pop("max_in_flight", 10), **kw)
        self.dispatcher.register(s)
        self.dispatcher._new_sessions.clear()  # already fed: only new work wakes it
        return s


@pytest.fixture
async def env(redis_url):
    e = ReadAheadEnv(redis_url)
    await e.groups.ensure(e.redis, ["q"])
    yield e
    await e.redis.aclose()


def drained(session: Session) -> list:
    out = []
    while not session.out.empty():
        out.append(session.out.get_nowait())
    return out


async def test_enqueue_reads_for_an_idle_session_in_the_same_round_trip(env):
    s = env.session()
    tid = await env.enqueue()
    assert s.reading and len(env.dispatcher._reads) == 1
    assert not env.dispatcher._dirty_queues  # no wake-up for a second read
    await env.dispatcher._round(tick=False)
    assert [t.task_id for t in drained(s)] == [tid]
    assert env.own_reads == 0 and not s.reading
    assert await env.status(tid) == "active"


async def test_sessions_take_turns(env):
    a, b = env.session(worker_id="wa"), env.session(worker_id="wb")
    first = await env.enqueue()
    second = await env.enqueue()  # `a` still has its read in flight
    await env.dispatcher._round(tick=False)
    assert [t.task_id for t in drained(a)] == [first]
    assert [t.task_id for t in drained(b)] == [second]
    assert env.own_reads == 0


async def test_a_session_filtering_for_the_task_type_reads_ahead(env):
    s = env.session(task_types=frozenset({"t", "u"}))
    tid = await env.enqueue(task_type="t")
    await env.dispatcher._round(tick=False)
    assert [t.task_id for t in drained(s)] == [tid] and env.own_reads == 0


@pytest.mark.parametrize("kind", ["full", "filtered", "closed"])
async def test_no_read_ahead_for_a_session_that_cannot_take_the_task(env, kind):
    s = env.session(task_types=frozenset({"other"}) if kind == "filtered" else frozenset())
    s.full = kind == "full"
    s.closed = kind == "closed"
    await env.enqueue()
    assert env.dispatcher._reads == [] and not s.reading
    assert env.dispatcher._dirty_queues == {"q"}  # the normal wake-up instead


async def test_delayed_task_is_not_read_ahead(env):
    s = env.session()
    tid = await env.enqueue(delay_ms=60_000)
    assert env.dispatcher._reads == [] and not s.reading
    assert await env.status(tid) == "scheduled"


async def test_empty_read_ahead_wakes_a_normal_round(env):
    s = env.session()
    await env.redis.set(keys.paused("q"), "1")
    tid = await env.enqueue()
    await env.dispatcher._round(tick=False)
    assert drained(s) == [] and env.own_reads == 1  # the round looked again itself
    await env.redis.delete(keys.paused("q"))
    env.dispatcher.notify("q")
    await env.dispatcher._round(tick=False)
    assert [t.task_id for t in drained(s)] == [tid]


async def test_cancelled_read_ahead_falls_back_to_the_wake_up(env):
    s = env.session()
    ahead = env.dispatcher.read_ahead("q", "t")
    assert ahead is not None and s.reading
    ahead.cancel()
    assert not s.reading and env.dispatcher._dirty_queues == {"q"}


async def test_a_failed_activation_strands_no_session(env):
    """If activating one read-ahead fails (Redis gone mid-round), every session whose
    read was pending can read ahead again (its entries are the reaper's, as for any
    read that was never activated)."""
    a, b = env.session(worker_id="wa"), env.session(worker_id="wb")
    await env.enqueue()
    await env.enqueue()
    assert a.reading and b.reading

    async def broken(session, reply):
        raise ConnectionError("redis went away")
    env.dispatcher._after_read = broken
    with pytest.raises(ConnectionError):
        await env.dispatcher._round(tick=False)
    assert not a.reading and not b.reading
