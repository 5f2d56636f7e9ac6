"""A dispatcher wired for read-ahead on a private Redis, shared by the dispatcher tests.

The dispatcher loop is not running; tests drive one round by hand, and the dispatcher's
own lease_take round trips are counted through ``Dispatcher.lease_now``.
"""

from __future__ import annotations

from dtq_gateway.leasing.sessions import Session
from tests.redis.test_core_scripts import Env


class ReadAheadEnv(Env):
    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.broker.on_queued = self.dispatcher.notify
        self.broker.read_ahead = self.dispatcher.read_ahead
        self.own_reads = 0
        lease = self.dispatcher.lease_now

        async def counted(session):
            self.own_reads += 1
            return await lease(session)
        self.dispatcher.lease_now = counted

    def session(self, **kw) -> Session:
        s = Session(worker_id=kw.pop("worker_id", "w1"), queues=kw.pop("queues", ["q"]),
                    max_in_flight=kw.pop("max_in_flight", 10), **kw)
        self.dispatcher.register(s)
        self.dispatcher._new_sessions.clear()  # already fed: only new work wakes it
        return s


def drained(session: Session) -> list:
    out = []
    while not session.out.empty():
        out.append(session.out.get_nowait())
    return out
