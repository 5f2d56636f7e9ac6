"""Lease dispatching: one loop per gateway feeds every open Lease stream.

A Lease stream registers a :class:`Session`; it holds no Redis connection and no
blocking read, so thousands of idle workers cost nothing in Redis. The
:class:`Dispatcher` wakes when a task is queued through this gateway, when a
``TASK_QUEUED``/``TASK_RETRIED`` event from another replica arrives, when a lease
finishes (credit freed), when a session opens, and on a periodic tick that covers
lost pub/sub messages and acks handled elsewhere. For each woken session it runs
``lease_read`` (credit from the PEL, strict p9 → p0) and ``activate`` — two round
trips for a whole batch — and stops trying a queue in that round as soon as a read
comes back empty. A unary enqueue through this gateway may carry the ``lease_read`` of
an idle session in its own round trip (:class:`ReadAhead`); the loop then only
activates what that read returned.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from dtq_gateway import metrics, observe, tracing
from dtq_gateway.errors import DtqError
from dtq_gateway.leasing.leaseid import Keyring, Lease, decode, default_keyring
from dtq_gateway.leasing.sessions import ReadAhead, Session
from dtq_gateway.settings import Settings
from dtq_gateway.store import leasing as store
from dtq_gateway.store import ratelimits
from dtq_gateway.store.client import Client
from dtq_gateway.store.errors import is_redis_outage
from dtq_gateway.store.groups import Groups
from dtq_gateway.store.leasing import OWN_EVENT, ReadGroup
from dtq_gateway.store.replies import text as _s
from dtq_proto import dtq_pb2

log = logging.getLogger(__name__)

#: Most entries one lease_read returns (bounds script run time).
BATCH_MAX = 256
#: Reads re-run at once after a task-type rate limit put entries back (per session, until
#: one delivers something): bounds the rotation through a stream of throttled entries.
LIMIT_REREADS = 4
#: A lease counts as heartbeated after it was written when its PEL idle time is at
#: least this much shorter than the time since the write (ms): covers the round trip.
RECEIPT_MARGIN_MS = 100
WAKE_EVENTS = frozenset({"TASK_QUEUED", "TASK_RETRIED"})
#: Events that end a lease of their worker_id (TASK_RETRIED: the reaper took a lost
#: lease away, which frees that worker's credit too)
FREE_EVENTS = frozenset({"TASK_SUCCEEDED", "TASK_RETRY_SCHEDULED", "TASK_DEAD_LETTERED",
                         "TASK_CANCELLED", "TASK_QUEUED", "TASK_RETRIED"})


class Dispatcher:
    """Feeds sessions from Redis. ``release(lease_ids)`` hands back undelivered leases."""

    def __init__(self, redis: Client, settings: Settings, groups: Groups,
                 release: Callable[[list[str]], Awaitable[None]],
                 tick_s: float = 1.0, keyring: Keyring | None = None) -> None:
        self.redis = redis
        #: signs the lease ids handed out (see leaseid.py)
        self.keyring = keyring or default_keyring()
        self.settings = settings
        self.groups = groups
        self.release = release
        self.tick_s = tick_s
        #: A worker whose last heartbeat is older than this gets no new leases (ms):
        #: two heartbeat intervals (the WORKER_STALE rule), at most the visibility timeout.
        self.stale_after_ms = min(2 * settings.heartbeat_interval_ms,
                                  settings.visibility_timeout_ms)
        #: Tasks that wait this long in a session's buffer with no write progress are
        #: released (s): half the visibility timeout, at most 5 s.
        self.release_after_s = min(5.0, settings.visibility_timeout_s / 2)
        #: stream health: a stream whose leases got no receipt for this long is checked
        #: in Redis (a heartbeat or ack through another replica, s): one heartbeat interval
        self.confirm_after_s = settings.heartbeat_interval_s
        #: ... and after this long with no receipt it stopped reading (s):
        #: DTQ_LEASE_STALL_HEARTBEATS intervals (default 2), at most half the visibility
        #: timeout; never when that setting is 0
        self.stall_after_s = (min(settings.lease_stall_heartbeats
                                  * settings.heartbeat_interval_s,
                                  settings.visibility_timeout_s / 2)
                              if settings.lease_stall_heartbeats else float("inf"))
        self.sessions: dict[str, Session] = {}
        #: open sessions by queue name, for read-ahead
        self._by_queue: dict[str, list[Session]] = {}
        #: open sessions by worker id (credit_freed, wake-ups of one worker)
        self._by_worker: dict[str, list[Session]] = {}
        self._reads: list[tuple[ReadAhead, Any]] = []
        self._wake = asyncio.Event()
        self._dirty_queues: set[str] = set()
        self._dirty_workers: set[str] = set()
        self._new_sessions: set[str] = set()
        #: sessions that read a full batch and read again: next round, after the others
        self._rereads: set[str] = set()
        self._task: asyncio.Task | None = None
        self._rr = itertools.count()
        self._last_error_log = 0.0
        #: payload bytes in every session's ``out`` (dtq_lease_buffered_bytes)
        self.buffered_total = 0
        #: reads a throttled queue again once its rate limit has a token
        self._limit_waker = ratelimits.Waker(self.notify)

    # -- notifications (cheap, synchronous) -------------------------------------------
    def notify(self, queue: str) -> None:
        """A task may be waiting in ``queue``."""
        self._dirty_queues.add(queue)
        self._wake.set()

    def read_ahead(self, queue: str, task_type: str) -> ReadAhead | None:
        """A lease_read to pipeline behind an enqueue of a ``task_type`` task into
        ``queue``, or None.

        Picks an open session of ``queue`` with credit, whose task-type filter (if any)
        takes ``task_type``, and with no other read-ahead in flight (rotating, so idle
        workers share the work). None when there is none; the caller then wakes the
        dispatcher with :meth:`notify` as usual.
        """
        on_queue = self._by_queue.get(queue)
        if not on_queue:
            return None
        for s in on_queue:
            if len(s.groups) == 1 and not (s.closed or s.full or s.reading or s.backlogged
                                           or s.stuck or not s.window_room()) \
                    and (not s.task_types or task_type in s.task_types) \
                    and self.groups.ready(s.queues):
                s.reading = True
                on_queue.remove(s)
                on_queue.append(s)
                return ReadAhead(self, s, queue)
        return None

    def credit_freed(self, worker_id: str) -> None:
        """A lease of ``worker_id`` finished; if its session was full it may take more.

        Called once per acked item: a worker already marked for the next round costs
        one set lookup, not a scan of every session (1,000 idle sessions = 1,000 checks).
        """
        self._wake_worker_if(worker_id, lambda s: s.full)

    def received(self, worker_id: str, lease_ids) -> None:
        """A heartbeat, Ack or Fail of ``worker_id`` through this gateway named
        ``lease_ids``: each is a receipt for the stream it was written to (and for every
        lease written to that stream before it). A session held back by a full unread
        window reads again."""
        sessions = self._by_worker.get(worker_id)
        if not sessions:
            return
        now = time.monotonic()
        for s in sessions:
            if s.unread and s.confirm(lease_ids, now) and s.window_held:
                s.window_held = False
                self._dirty_workers.add(worker_id)
                self._wake.set()

    def worker_alive(self, worker_id: str) -> None:
        """The worker heartbeated through this gateway: a session of it that was held
        back as stalled (no recent heartbeat) is read again at once, not at the tick."""
        self._wake_worker_if(worker_id, lambda s: s.stalled)

    def _wake_worker_if(self, worker_id: str, held: Callable[[Session], bool]) -> None:
        """Mark the worker for the next round when one of its sessions is ``held``."""
        if worker_id in self._dirty_workers:
            return
        if any(held(s) for s in self._by_worker.get(worker_id, ())):
            self._dirty_workers.add(worker_id)
            self._wake.set()

    def wants_raw_event(self, raw: bytes) -> bool:
        """Raw pre-filter for the events hub: this process's own events never (it already
        acted on them), wake-up types always, lease-ending types only while some session
        is full (only then do other replicas' acks matter)."""
        if OWN_EVENT in raw:
            return False
        if b"TASK_QUEUED" in raw or b"TASK_RETRIED\"" in raw or b"CONFIGURATION_CHANGED" in raw:
            return True
        return any(s.full for s in self.sessions.values())

    def on_event(self, event: dict) -> None:
        """Listener for the shared events subscriber (other replicas' activity)."""
        etype = event.get("type")
        if etype in WAKE_EVENTS and event.get("queue"):
            self.notify(event["queue"])
        elif etype == "CONFIGURATION_CHANGED" and event.get("queue"):
            self.notify(event["queue"])  # a resumed queue leases at once, not at the tick
        if etype in FREE_EVENTS and event.get("worker_id"):
            self.credit_freed(event["worker_id"])

    # -- sessions --------------------------------------------------------------------
    def register(self, session: Session) -> None:
        """Start feeding a session."""
        self.sessions[session.session_id] = session
        for q in session.queues:
            self._by_queue.setdefault(q, []).append(session)
        self._by_worker.setdefault(session.worker_id, []).append(session)
        metrics.LEASE_SESSIONS.set(len(self.sessions))
        self._new_sessions.add(session.session_id)
        self._wake.set()

    async def unregister(self, session: Session) -> None:
        """Stop feeding a session and hand back leases it never delivered."""
        session.closed = True
        if self.sessions.pop(session.session_id, None) is not None:
            for index, name in [(self._by_queue, q) for q in session.queues] + \
                    [(self._by_worker, session.worker_id)]:
                listed = index.get(name, [])
                if session in listed:
                    listed.remove(session)
                if not listed:
                    index.pop(name, None)
        metrics.LEASE_SESSIONS.set(len(self.sessions))
        undelivered = []
        while not session.out.empty():
            item = session.out.get_nowait()
            if item is not None:
                undelivered.append(item.lease_id)
        self.buffered(session, -session.buffered_bytes)
        if undelivered:
            try:
                await self.release(undelivered)
            except Exception:  # noqa: BLE001 - the reaper reclaims them if this fails
                log.warning("could not release undelivered leases",
                            extra={"worker_id": session.worker_id, "count": len(undelivered)})

    def end_worker(self, worker_id: str) -> None:
        """The worker is draining: deliver nothing more and end its streams with OK.

        The end marker is queued behind every task already handed to the stream, so a
        worker that reads to the end has received every lease it holds.
        """
        for s in list(self._by_worker.get(worker_id, ())):
            if not s.closed:
                s.closed = True
                s.worker_draining = True
                s.out.put_nowait(None)

    # -- loop ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the dispatch loop task."""
        self._task = asyncio.create_task(self._run(), name="dtq-dispatcher")

    async def stop(self) -> None:
        """Stop the loop and end every session's stream."""
        self._limit_waker.cancel()
        if self._task:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=2.0)  # bounded: a stop must not hang
        for s in list(self.sessions.values()):
            s.out.put_nowait(None)

    async def _run(self) -> None:
        backoff = 0.05
        last_tick = time.monotonic()
        while True:
            tick = False
            try:
                if not self._wake.is_set():  # timeout(): a timer, not a task per wake-up
                    wait_s = max(0.0, last_tick + self.tick_s - time.monotonic())
                    async with asyncio.timeout(wait_s):
                        await self._wake.wait()
            except TimeoutError:
                tick = True
            # the periodic re-check also runs while wake-ups keep the loop busy (under
            # load a wake-up comes every few ms, so waiting for a quiet tick_s would
            # starve full and stalled sessions that only the tick looks at)
            if time.monotonic() - last_tick >= self.tick_s:
                tick = True
            if tick:
                last_tick = time.monotonic()
            self._wake.clear()
            try:
                await self._round(tick)
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep dispatching; log and back off
                if is_redis_outage(exc):
                    # unreachable, loading, a cluster slot down or moving: no traceback
                    self._log_error("redis unavailable for leasing", exc)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                    self._wake.set()
                    continue
                self._log_error("dispatch round failed", exc, exc_info=True)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    def stream_progress(self, session: Session) -> None:
        """The session's stream wrote a task (called by the Lease handler after each
        write): once ``out`` is empty, a read that was held back happens now."""
        session.out_since = time.monotonic()
        session.stuck = False
        if session.held_back and not session.backlogged and not session.closed:
            session.held_back = False
            self._dirty_workers.add(session.worker_id)
            self._wake.set()

    async def _release_unwritten(self) -> None:
        """Hand back the tasks that waited in a session's ``out`` with no write progress
        for ``release_after_s``: the reader is stuck (no window, a black-holed
        connection). Released leases go back to their queue without spending an attempt,
        instead of expiring unread and coming back as a retry."""
        now = time.monotonic()
        for s in list(self.sessions.values()):
            if s.backlogged and now - s.out_since > self.release_after_s:
                ids = []
                while not s.out.empty():
                    item = s.out.get_nowait()
                    if item is None:  # the end marker stays last
                        s.out.put_nowait(None)
                        break
                    ids.append(item.lease_id)
                self.buffered(s, -s.buffered_bytes)
                if ids:
                    log.warning("lease stream is not reading: released %d undelivered "
                                "leases", len(ids), extra={"worker_id": s.worker_id,
                                                            "session_id": s.session_id})
                    s.held_back = s.stuck = True
                    await self.release(ids)

    async def _check_streams(self) -> None:
        """Stream health, on the tick: find the Lease streams that stopped reading.

        A stream whose unread leases got no receipt here for ``confirm_after_s`` (or whose
        full window waited a tick) is looked up in Redis: a lease no longer pending (acked,
        failed, released by the worker) or heartbeated after it was written is a receipt
        that went through another replica. A stream still without a receipt after
        ``stall_after_s``, while its worker's heartbeats kept arriving, stopped reading:
        see :meth:`_stall`.
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
            if state is None or (state[0] == lease.worker_id
                                 and state[1] + RECEIPT_MARGIN_MS < (now - at) * 1000):
                got.setdefault(s, []).append(lease_id)
        for s, ids in got.items():
            self.received(s.worker_id, ids)
        # ... and the worker heartbeated (through any replica) at least one interval
        # into that silence, without naming them: it is alive and does not hold them. A
        # worker whose heartbeats stopped too (a blocked event loop, a frozen process)
        # may be running them: its leases expire as usual, spending an attempt, so a
        # task that hangs its worker still reaches its max_attempts.
        quiet = [(s, now - max(s.receipt_at, next(iter(s.unread.values()))[1]))
                 for s in due if s.unread and not s.closed and not s.not_reading]
        quiet = [(s, q) for s, q in quiet if q > self.stall_after_s]
        heard = await store.workers_heard(
            self.redis, [(s.worker_id, int((q - self.confirm_after_s) * 1000))
                         for s, q in quiet])
        for (s, _), alive in zip(quiet, heard):
            if alive and not s.closed and not s.not_reading:
                await self._stall(s)

    async def _stall(self, session: Session) -> None:
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

    def _log_error(self, msg: str, exc: BaseException, exc_info: bool = False) -> None:
        now = time.monotonic()
        if now - self._last_error_log > 5:
            self._last_error_log = now
            log.warning(msg, extra={"error": repr(exc)}, exc_info=exc_info)

    def _candidates(self, tick: bool) -> list[Session]:
        queues, workers, new = self._dirty_queues, self._dirty_workers, self._new_sessions
        rereads = self._rereads
        self._dirty_queues, self._dirty_workers, self._new_sessions = set(), set(), set()
        self._rereads = set()
        if tick:
            sessions = list(self.sessions.values())
        else:  # only sessions something happened to: independent of idle sessions
            woken: dict[Session, None] = {}
            for q in queues:
                woken.update(dict.fromkeys(self._by_queue.get(q, ())))
            for w in workers:
                woken.update(dict.fromkeys(self._by_worker.get(w, ())))
            woken.update(dict.fromkeys(self.sessions[i] for i in new if i in self.sessions))
            sessions = list(woken)
        if len(sessions) > 1:
            start = next(self._rr) % len(sessions)
            sessions = sessions[start:] + sessions[:start]
        picked = []
        for s in sessions:
            if s.closed:
                continue
            if s.backlogged or s.stuck:
                # write-paced: the stream has not written what it already has (a slow or
                # stuck reader); it reads again once it has (stream_progress)
                s.held_back = True
                continue
            if not s.window_room():
                # its unread window is full: it reads again on a receipt (received)
                s.window_held = True
                continue
            if s.worker_id in workers:
                s.full = False
            if (tick or s.worker_id in workers or s.session_id in new
                    or (not s.full and not queues.isdisjoint(s.queues))):
                picked.append(s)
        if rereads:  # a burst is spread: the sessions that just read a full batch go last
            picked.sort(key=lambda s: s.session_id in rereads)
        return picked

    async def _round(self, tick: bool) -> None:
        reads, self._reads = self._reads, []
        for ahead, _ in reads:  # cleared first: a failed activation must not strand one
            ahead.session.reading = False
        for ahead, reply in reads:
            if isinstance(reply, BaseException):
                self.notify(ahead.queue)
                continue
            got, credit_left, _, _ = await self._after_read(ahead.session, reply)
            if not got or not credit_left:
                # nothing for this session (taken elsewhere, paused, stalled) or it is
                # full now: the queue may hold more, let the round look at every session
                self.notify(ahead.queue)
        # Once a read shows a session's queues hold nothing new for the group, later
        # sessions of those queues skip this round (the tick too, so 1,000 idle streams
        # cost one read, not 1,000; see _after_read).
        empty: set[str] = set()
        skipped: list[Session] = []
        for session in self._candidates(tick):
            if session.closed:
                continue
            if empty.issuperset(session.queues):
                skipped.append(session)
                continue
            got, credit_left, _, queues_empty = await self._lease(session)
            if queues_empty:
                empty.update(session.queues)
            elif credit_left and got >= session.read_cap(BATCH_MAX):
                # more may be waiting: this session reads again next round, after the
                # other sessions of its queues had their turn (a burst is spread): they
                # are woken too, and the re-reading session goes last
                self._dirty_workers.add(session.worker_id)
                self._dirty_queues.update(session.queues)
                self._rereads.add(session.session_id)
                self._wake.set()
        if tick and skipped:
            await self._end_draining({s.worker_id for s in skipped})
        if tick:
            await self._release_unwritten()
            await self._check_streams()

    async def _end_draining(self, worker_ids: set[str]) -> None:
        """End the streams of workers whose record says ``draining``.

        A worker's Heartbeat(draining) may reach another replica; lease_read notices it
        only when it runs for the session, so the tick asks for the sessions it skipped:
        one worker_states call (one round trip, one reply) per 1,000 workers.
        """
        workers = sorted(worker_ids)
        for i in range(0, len(workers), 1000):
            chunk = workers[i:i + 1000]
            states = await store.worker_states(self.redis, chunk)
            for worker_id, status in zip(chunk, states):
                if status == "draining":
                    self.end_worker(worker_id)

    def _check_call(self, session: Session) -> tuple[list[str], list]:
        """KEYS and ARGV of the worker_check for ``session``'s worker."""
        return store.worker_check_call(session.worker_id, self.stale_after_ms)

    def _read_call(self, session: Session, group: ReadGroup, max_in_flight: int | None = None,
                   most: int | None = None) -> tuple[list[str], list]:
        """KEYS and ARGV of a lease_read of one slot group of ``session``."""
        return store.lease_read_call(
            group, session.worker_id,
            session.max_in_flight if max_in_flight is None else max_in_flight,
            session.read_cap(BATCH_MAX) if most is None else most)

    def _merge(self, session: Session, state: int, reads: list[tuple[ReadGroup, list]],
               pending: int | None = None) -> list:
        """One lease_read-shaped reply for the whole session from its groups' replies:
        stream indexes mapped into ``session.streams``, the worker_check ``state`` in
        the stalled slot, ``pending`` (default: the groups' own counts) summed."""
        total = 0
        missing: list[int] = []
        live = 0
        entries: list = []
        wait_ms = 0
        sets: tuple[set[int], set[int], set[int]] = (set(), set(), set())
        position = {q: n + 1 for n, q in enumerate(session.queues)}
        for group, reply in reads:
            total += int(reply[0])
            missing += [group.index[int(i) - 1] for i in reply[1]]
            live += int(reply[3])
            lim = reply[4]
            if int(lim[0]) and (not wait_ms or int(lim[0]) < wait_ms):
                wait_ms = int(lim[0])
            for k in (1, 2, 3):
                sets[k - 1].update(position[group.queues[int(q) - 1]] for q in lim[k])
            entries += [(group.index[int(i) - 1], e, raw) for i, e, raw in reply[5:]]
        limits = [wait_ms, *(sorted(x) for x in sets)]
        return [total if pending is None else pending, missing, state, live, limits, *entries]

    async def _lease(self, session: Session) -> tuple[int, bool, int, bool]:
        """worker_check + lease_read (slot by slot) + activate for a session; see
        :meth:`_after_read`.

        A session with one read group (every session on a standalone Redis, and one
        whose queues share a hash slot on a cluster) costs one round trip for the check
        and the read. On a cluster, queues in several slots are read slot
        by slot: first the check and every slot's pending count (one pipeline), then the
        non-empty (band, slot) pairs from p9 down, each read with the credit the earlier
        ones left, so strict priority holds across slots too (one round trip per pair).
        """
        await self.groups.ensure(self.redis, session.queues)
        single = len(session.groups) == 1
        state, replies = await store.check_and_read(
            self.redis, self._check_call(session),
            [self._read_call(session, group, most=None if single else 0)
             for group in session.groups])
        if single or state:
            if not single:
                replies = [r[:5] for r in replies]  # peeks: their live lists are no entries
            return await self._after_read(session, self._merge(
                session, state, list(zip(session.groups, replies))))
        pending = sum(int(r[0]) for r in replies)
        credit = min(session.max_in_flight - pending, session.read_cap(BATCH_MAX))
        # strict p9 -> p0 across slots: one read per (band, slot group) holding entries
        live = sorted(
            ((9 - (int(i) - 1) // len(g.queues), n, g, int(i))
             for n, (g, peek) in enumerate(zip(session.groups, replies)) if not peek[1]
             for i in peek[5]),
            key=lambda x: (-x[0], x[1]))
        reads = [(g, [0, peek[1], 0, peek[3], peek[4]]) for g, peek in zip(session.groups, replies)]
        done: set[tuple[int, int]] = set()
        for band, n, group, _ in live:
            if credit <= 0 or (band, n) in done:
                continue
            done.add((band, n))
            sub = group.band(band)
            got = await store.lease_read(self.redis, self._read_call(
                session, sub, int(replies[n][0]) + credit, credit))
            credit -= len(got) - 5
            reads.append((sub, [0, got[1], 0, 0, got[4], *got[5:]]))
        return await self._after_read(session, self._merge(session, 0, reads, pending))

    async def _after_read(self, session: Session, reply: list
                          ) -> tuple[int, bool, int, bool]:
        """Activate what a lease_read returned.

        Returns (leases delivered, whether the session had credit left, entries read,
        whether its queues hold nothing new for the group). Entries read but not
        delivered were put back (task-type filter) or absorbed. The queues count as
        empty when every band stream was empty, or when a read with credit left
        returned no entry (XREADGROUP ``>`` is group-wide, so no other session of
        these queues would get one either).
        """
        streams = session.streams
        pending, missing, stalled = int(reply[0]), reply[1], int(reply[2])
        live, entries = int(reply[3]), reply[5:]
        limits = ratelimits.Limits.from_reply(reply[4], session.queues)
        self._limit_waker.throttled(limits.throttled, limits.wait_ms, metrics.RATE_LIMITED_READS)
        if stalled and entries:
            # read in the same round trip as the check that says the worker may take
            # nothing: the entries go back to their queues
            await self._activate(session, streams, entries, limits, put_back=True)
        if stalled == 2:
            self.end_worker(session.worker_id)
            return 0, False, 0, live == 0
        session.stalled = bool(stalled)
        if stalled:
            session.full = True  # read again at its next heartbeat here, or the tick
            return 0, False, 0, live == 0
        if missing:
            self.groups.forget({session.where[streams[int(i) - 1]][0] for i in missing})
            self._dirty_workers.add(session.worker_id)
            self._wake.set()
        credit = session.max_in_flight - pending - len(entries)
        session.full = credit <= 0
        if not entries:
            return 0, credit > 0, 0, live == 0 or credit > 0
        delivered = await self._activate(session, streams, entries, limits)
        if delivered:
            session.limit_rounds = 0
        if session.limit_held:
            # Entries of a throttled task type went back to the tail of their stream, so
            # the credit they took is free again and other types may wait behind them:
            # read again at once, at most LIMIT_REREADS times in a row (a stream of only
            # throttled entries must not turn into a busy loop; the limit's timer or the
            # tick reads it later). A read that delivered something resets the count.
            credit = session.max_in_flight - pending - delivered
            session.full = credit <= 0
            if credit > 0 and session.limit_rounds < LIMIT_REREADS:
                session.limit_rounds += 1
                self._dirty_workers.add(session.worker_id)
                self._wake.set()
        return delivered, credit > 0, len(entries), False

    async def _activate(self, session: Session, streams: list[str], entries: list,
                        limits: ratelimits.Limits | None = None,
                        put_back: bool = False) -> int:
        """activate.lua for the entries a read returned: one call per queue (one hash
        slot each), one pipeline. ``put_back``: every entry goes back to the tail of its
        band (mode 'r'), none is delivered (queue-wide tokens they took are returned)."""
        limits = limits or ratelimits.Limits(0, set(), set(), set())
        await self.keyring.ensure()
        parsed = []
        for index, entry_id, raw in entries:
            f = {_s(raw[i]): raw[i + 1] for i in range(0, len(raw), 2)}
            parsed.append((streams[int(index) - 1], _s(entry_id), f))
        modes = [("r" if put_back or (session.task_types
                                      and _s(f["task_type"]) not in session.task_types)
                  else "a") for _, _, f in parsed]
        held = set() if put_back else await self._hold_throttled_types(parsed, modes, limits)
        session.limit_held = len(held)
        replies, digests = await store.activate(self.redis, session.worker_id,
                                                self.settings.task_retention_s, parsed, modes)
        tasks = []
        returns: dict[str, Counter[str]] = {}
        for i, ((stream, entry_id, f), digest, rep) in enumerate(zip(parsed, digests, replies)):
            kind = _s(rep[0])
            if kind == "ok":
                tasks.append(self._leased_task(session, stream, entry_id, f, digest, rep))
                continue
            if kind == "expired":
                observe.expired(_s(f["queue"]))
            queue = _s(f["queue"])
            if queue in limits.limited:  # its tokens were taken for nothing: give them back
                back = returns.setdefault(queue, Counter())
                back[ratelimits.QUEUE_SCOPE] += 1
                if queue in limits.typed and modes[i] == "a" and i not in held:
                    back[_s(f["task_type"])] += 1
        if returns:
            await ratelimits.give_back(self.redis, returns)
        if put_back:
            return 0
        if session.closed:
            # the stream ended while this batch was being activated: hand it back
            await self.release([t.lease_id for t in tasks])
            return 0
        if tasks and not session.backlogged:
            session.out_since = time.monotonic()
        cap, over = self.settings.lease_buffer_max_bytes, []
        for task in tasks:
            size = len(task.payload)
            if session.buffered_bytes and session.buffered_bytes + size > cap:
                over.append(task.lease_id)  # one task always fits an empty buffer
                continue
            observe.delivered(task)
            self.buffered(session, size)
            if task.traceparent:
                tracing.delivered(task.metadata, {"dtq.task_id": task.task_id,
                                                  "dtq.worker_id": session.worker_id})
            session.out.put_nowait(task)
        if over:
            # the stream has not written what it holds: hand the rest back now (no
            # attempt spent) instead of pinning their payloads until it reads
            metrics.LIMIT_REFUSALS.labels(limit="lease_buffer_max_bytes").inc(len(over))
            session.held_back = True
            await self.release(over)
        return len(tasks) - len(over)

    def buffered(self, session: Session, delta: int) -> None:
        """Account ``delta`` payload bytes put into (+) or taken from (-) ``session.out``."""
        session.buffered_bytes = max(0, session.buffered_bytes + delta)
        self.buffered_total = max(0, self.buffered_total + delta)
        metrics.LEASE_BUFFERED_BYTES.set(self.buffered_total)

    async def _hold_throttled_types(self, parsed: list, modes: list[str],
                                    limits: ratelimits.Limits) -> set[int]:
        """Take task-type tokens for the entries about to be activated; an entry that
        gets none is switched to mode ``r`` (put back, still queued, no attempt spent).
        Returns the positions of the entries held back."""
        if not limits.typed:
            return set()
        wanted = [(i, (_s(f["queue"]), _s(f["task_type"]))) for i, (_, _, f) in
                  enumerate(parsed) if modes[i] == "a" and _s(f["queue"]) in limits.typed]
        if not wanted:
            return set()
        granted, waits = await ratelimits.take_types(self.redis, [w for _, w in wanted])
        held = {i for (i, _), ok in zip(wanted, granted) if not ok}
        for i in held:
            modes[i] = "r"
        for queue, wait_ms in waits.items():
            count = sum(1 for i, (q, _) in wanted if q == queue and i in held)
            self._limit_waker.throttled({queue}, wait_ms, metrics.RATE_LIMITED_TASKS, count)
        return held

    def _leased_task(self, session: Session, stream: str, entry_id: str, f: dict,
                     digest: str, rep: list) -> dtq_pb2.LeasedTask:
        queue, band = session.where[stream]
        task_id, attempt = _s(f["task_id"]), int(f["attempt"])
        lease = Lease(task_id, queue, band, entry_id, attempt, session.worker_id, digest,
                      session.owner)
        metadata = json.loads(rep[2]) if rep[2] else {}
        return dtq_pb2.LeasedTask(
            lease_id=lease.encode(self.keyring), task_id=task_id, queue=queue,
            task_type=_s(f["task_type"]), payload=f.get("payload", b""),
            content_type=_s(rep[1] or b""), priority=band, attempt=attempt,
            max_attempts=int(f["max_attempts"]), timeout_ms=int(f["timeout_ms"]),
            idempotency_key=_s(f.get("idempotency_key", b"")), metadata=metadata,
            created_at_ms=int(rep[3] or 0), leased_at_ms=int(rep[4]),
            traceparent=metadata.get("traceparent", ""),
            tracestate=metadata.get("tracestate", ""))
