"""Stream health: Lease streams that stopped reading, found and ended.

A Lease stream is written in order; a heartbeat, Ack or Fail naming a lease is a
receipt for it and every lease written before it (Session.confirm). On the dispatcher's
tick, :class:`StreamHealth` releases tasks that waited too long in a session's buffer
with no write progress (:meth:`StreamHealth.release_unwritten`), looks up in Redis the
leases of streams with no receipt for a while (:meth:`StreamHealth.check_streams`), and
ends a stream whose worker kept heartbeating without naming them
(:meth:`StreamHealth.stall`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from dtq_gateway import metrics
from dtq_gateway.errors import DtqError
from dtq_gateway.leasing.leaseid import Keyring, decode
from dtq_gateway.leasing.sessions import Session
from dtq_gateway.settings import Settings
from dtq_gateway.store import leasing as store
from dtq_gateway.store.client import Client

log = logging.getLogger(__name__)

#: A lease counts as heartbeated after it was written when its PEL idle time is at
#: least this much shorter than the time since the write (ms): covers the round trip.
RECEIPT_MARGIN_MS = 100


class StreamHealth:
    """Finds the Lease streams of ``sessions`` that stopped reading.

    Args:
        redis: the gateway's Redis client.
        settings: heartbeat interval, visibility timeout, DTQ_LEASE_STALL_HEARTBEATS.
        sessions: the dispatcher's open sessions by session id (read, not changed).
        keyring: decodes the lease ids handed out.
        release: ``release(lease_ids)`` hands leases back (no attempt spent).
        received: ``received(worker_id, lease_ids)``: the dispatcher's receipt hook.
        buffered: ``buffered(session, delta_bytes)``: buffered-bytes accounting.
        tick_s: the dispatcher's tick (s).
    """

    def __init__(self, redis: Client, settings: Settings, sessions: dict[str, Session],
                 keyring: Keyring, release: Callable[[list[str]], Awaitable[None]],
                 received: Callable[[str, list[str]], None],
                 buffered: Callable[[Session, int], None], tick_s: float) -> None:
        self.redis, self.sessions, self.keyring = redis, sessions, keyring
        self.release, self.received, self.buffered = release, received, buffered
        self.tick_s = tick_s
        #: Tasks that wait this long in a session's buffer with no write progress are
        #: released (s): half the visibility timeout, at most 5 s.
        self.release_after_s = min(5.0, settings.visibility_timeout_s / 2)
        #: a stream whose leases got no receipt for this long is checked in Redis (a
        #: heartbeat or ack through another replica, s): one heartbeat interval
        self.confirm_after_s = settings.heartbeat_interval_s
        #: ... and after this long with no receipt it stopped reading (s):
        #: DTQ_LEASE_STALL_HEARTBEATS intervals (default 2), at most half the visibility
        #: timeout; never when that setting is 0
        self.stall_after_s = (min(settings.lease_stall_heartbeats
                                  * settings.heartbeat_interval_s,
                                  settings.visibility_timeout_s / 2)
                              if settings.lease_stall_heartbeats else float("inf"))

    async def release_unwritten(self) -> None:
        """Hand back the tasks that waited in a session's ``out`` with no write progress
        for ``release_after_s``: the reader is stuck (no window, a black-holed
        connection). Released leases go back to their queue without spending an attempt,
        instead of expiring unread and coming back as a retry."""
        now = time.monotonic()
        for s in list(self.sessions.values()):
            if s.backlogged and now - s.out_since > self.release_after_s:
                ids, ended = s.take_unsent()
                if ended:  # the end marker stays
                    s.out.put_nowait(None)
                self.buffered(s, -s.buffered_bytes)
                if ids:
                    log.warning("lease stream is not reading: released %d undelivered "
                                "leases", len(ids), extra={"worker_id": s.worker_id,
                                                            "session_id": s.session_id})
                    s.held_back = s.stuck = True
                    await self.release(ids)

    async def check_streams(self) -> None:
        """Stream health, on the tick: find the Lease streams that stopped reading.

        A stream whose unread leases got no receipt here for ``confirm_after_s`` (or whose
        full window waited a tick) is looked up in Redis: a lease no longer pending (acked,
        failed, released by the worker) or heartbeated after it was written is a receipt
        that went through another replica. A stream still without a receipt after
        ``stall_after_s``, while its worker's heartbeats kept arriving, stopped reading:
        see :meth:`stall`.
        """
        now = time.monotonic()
        due = []
        for s in self.sessions.values():
            if not s.unread or s.closed:
                continue
            quiet = now - max(s.receipt_at, next(iter(s.unread.values()))[1])
            if quiet > self.confirm_after_s or (s.window_held and quiet > self.tick_s):
                due.append(s)
        if not due:
            return
        await self._receipts_from_redis(due)
        await self._stall_silent(due)

    async def _receipts_from_redis(self, due: list[Session]) -> None:
        """Receipts that went through another replica: a lease of ``due`` no longer
        pending, or heartbeated after it was written (one XPENDING per lease)."""
        asked = []
        for s in due:
            for lease_id, (_, at) in s.unread.items():
                try:
                    lease = decode(lease_id, self.keyring)
                except DtqError:  # signed by a secret dropped since: no receipt from it
                    continue
                asked.append((s, lease_id, lease, at))
        states = await store.leases_pending(
            self.redis, [(lease.queue, lease.band, lease.entry_id) for _, _, lease, _ in asked])
        now = time.monotonic()
        got: dict[Session, list[str]] = {}
        for (s, lease_id, lease, at), state in zip(asked, states):
            if state is None or (state.consumer == lease.worker_id
                                 and state.idle_ms + RECEIPT_MARGIN_MS < (now - at) * 1000):
                got.setdefault(s, []).append(lease_id)
        for s, ids in got.items():
            self.received(s.worker_id, ids)

    async def _stall_silent(self, due: list[Session]) -> None:
        """Stall the streams of ``due`` still without a receipt after
        ``stall_after_s`` whose worker heartbeated (through any replica) at least one
        interval into that silence without naming them: it is alive and does not hold
        them. A worker whose heartbeats stopped too (a blocked event loop, a frozen
        process) may be running them: its leases expire as usual, spending an attempt,
        so a task that hangs its worker still reaches its max_attempts."""
        now = time.monotonic()
        silent = [(s, now - max(s.receipt_at, next(iter(s.unread.values()))[1]))
                  for s in due if s.unread and not s.closed and not s.not_reading]
        silent = [(s, q) for s, q in silent if q > self.stall_after_s]
        heard = await store.workers_heard(
            self.redis, [(s.worker_id, int((q - self.confirm_after_s) * 1000))
                         for s, q in silent])
        for (s, _), alive in zip(silent, heard):
            if alive and not s.closed and not s.not_reading:
                await self.stall(s)

    async def stall(self, session: Session) -> None:
        """The stream stopped reading: release its unread leases (back to their queues,
        no attempt spent; a late Ack or heartbeat of one is refused as stale) and end
        its Lease call with UNAVAILABLE (reason NOT_READING), so the worker opens a new
        stream once its connection reads again. Its worker shows alive, not leasing,
        in ListWorkers while it has no other stream."""
        session.not_reading = True
        if session.handler is not None:
            session.handler.cancel()
        ids = list(session.unread)
        session.unread.clear()
        metrics.LEASE_STREAMS_NOT_READING.inc()
        metrics.LEASES_RELEASED_UNREAD.inc(len(ids))
        log.warning("lease stream is not reading: ending it and releasing %d unread leases",
                    len(ids), extra={"worker_id": session.worker_id,
                                     "session_id": session.session_id})
        if ids:
            await self.release(ids)
