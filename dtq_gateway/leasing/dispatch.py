"""Lease dispatching: one loop per gateway feeds every open Lease stream.

A Lease stream registers a :class:`Session`; it holds no Redis connection and no
blocking read, so thousands of idle workers cost nothing in Redis. The
:class:`Dispatcher` wakes when a task is queued through this gateway, when a
``TASK_QUEUED``/``TASK_RETRIED`` event from another replica arrives, when a lease
finishes (credit freed), when a session opens, and on a periodic tick that covers
lost pub/sub messages and acks handled elsewhere. For each woken session it runs
``worker_check`` and ``lease_take`` (credit from the PEL, strict p9 → p0, read and
activated in one script call) — one round trip for a whole batch — and stops trying a
queue in that round as soon as a read comes back empty. A unary enqueue through this
gateway may carry the ``lease_take`` of an idle session in its own round trip
(:class:`ReadAhead`); the loop then only builds the LeasedTasks.

This module decides who reads and when (wake-ups, candidates, rounds);
``activation.py`` turns what a read returned into LeasedTasks in a session's buffer,
``stream_health.py`` finds streams that stopped reading.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Awaitable, Callable

from dtq_gateway import metrics
from dtq_gateway.leasing.activation import Activator
from dtq_gateway.leasing.leaseid import Keyring, Lease, default_keyring
from dtq_gateway.leasing.reader import BATCH_MAX, SessionReader
from dtq_gateway.leasing.sessions import ReadAhead, Session
from dtq_gateway.leasing.stream_health import StreamHealth
from dtq_gateway.leasing.wake_loop import WakeLoop
from dtq_gateway.settings import Settings
from dtq_gateway.store import ratelimits
from dtq_gateway.store.client import Client
from dtq_gateway.store.groups import Groups
from dtq_gateway.store.lease_replies import LeaseRead, WorkerState
from dtq_gateway.store.leasing import OWN_EVENT
from dtq_proto import dtq_pb2

#: Reads re-run at once after a task-type rate limit put entries back (per session, until
#: one delivers something): bounds the rotation through a stream of throttled entries.
LIMIT_REREADS = 4
#: Reads re-run at once, besides those, while lease_take's scan bound (256 entries read
#: per call) ended the last read with credit left and entries put back (per session,
#: until one delivers something): a session gets past up to 16 × 256 entries it does
#: not take at once, then at the tick, so a stream of only such entries is no busy loop.
SCAN_REREADS = 16
WAKE_EVENTS = frozenset({"TASK_QUEUED", "TASK_RETRIED"})
#: Internal event of cancel.lua / cancel_matching.lua: an active task was flagged
#: cancel_requested (its lease's parts in the metadata; see cancel_requested)
CANCEL_EVENT = "TASK_CANCEL_REQUESTED"
_CANCEL_RAW = CANCEL_EVENT.encode()
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
        #: sends a session's calls (its ``stale_after_ms``: heartbeat age that stalls)
        self.reader = SessionReader(redis, settings, groups)
        self.sessions: dict[str, Session] = {}
        #: open sessions by queue name, for read-ahead
        self._by_queue: dict[str, list[Session]] = {}
        #: open sessions by worker id (credit_freed, wake-ups of one worker)
        self._by_worker: dict[str, list[Session]] = {}
        #: open sessions that accept cancel notices (0: cancel events are not decoded)
        self._notice_sessions = 0
        #: read-aheads answered since the last round: (session, queue, read; an
        #: exception or None when the read failed)
        self._reads: list[tuple[Session, str, LeaseRead | BaseException | None]] = []
        self._loop = WakeLoop(self.run_round, tick_s)
        self._wake = self._loop.event
        self._dirty_queues: set[str] = set()
        self._dirty_workers: set[str] = set()
        self._new_sessions: set[str] = set()
        #: sessions that read a full batch and read again: next round, after the others
        self._rereads: set[str] = set()
        self._rr = itertools.count()
        #: reads a throttled queue again once its rate limit has a token
        self._limit_waker = ratelimits.Waker(self.notify)
        self.activator = Activator(redis, settings, self.keyring, release, self._limit_waker)
        #: finds streams that stopped reading (its ``stall_after_s``: how long unread)
        self.health = StreamHealth(redis, settings, self.sessions, self.keyring, release,
                                   self.received, self.buffered, tick_s)

    @property
    def buffered_total(self) -> int:
        """Payload bytes in every session's ``out`` (dtq_lease_buffered_bytes)."""
        return self.activator.buffered_total

    def buffered(self, session: Session, delta: int) -> None:
        """Account ``delta`` payload bytes put into (+) or taken from (-) ``session.out``."""
        self.activator.buffered(session, delta)

    # -- notifications (cheap, synchronous) -------------------------------------------
    def notify(self, queue: str) -> None:
        """A task may be waiting in ``queue``."""
        self._dirty_queues.add(queue)
        self._wake.set()

    def read_ahead(self, queue: str, task_type: str) -> ReadAhead | None:
        """A lease_take to pipeline behind an enqueue of a ``task_type`` task into
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
            if len(s.slot_reads) == 1 and not (s.closed or s.full or s.reading or s.backlogged
                                           or s.stuck or not s.window_room()) \
                    and (not s.task_types or task_type in s.task_types) \
                    and self.groups.ready(s.queues):
                s.reading = True
                on_queue.remove(s)
                on_queue.append(s)
                return ReadAhead(s, queue, self.reader.ahead_calls, self._ahead_read)
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
        acted on them), wake-up types always, cancel requests while some session accepts
        cancel notices, lease-ending types only while some session is full (only then do
        other replicas' acks matter)."""
        if OWN_EVENT in raw:
            return False
        if b"TASK_QUEUED" in raw or b"TASK_RETRIED\"" in raw or b"CONFIGURATION_CHANGED" in raw:
            return True
        if self._notice_sessions and _CANCEL_RAW in raw:
            return True
        return any(s.full for s in self.sessions.values())

    def on_event(self, event: dict) -> None:
        """Listener for the shared events subscriber (other replicas' activity)."""
        etype = event.get("type")
        if etype in WAKE_EVENTS and event.get("queue"):
            self.notify(event["queue"])
        elif etype == "CONFIGURATION_CHANGED" and event.get("queue"):
            self.notify(event["queue"])  # a resumed queue leases at once, not at the tick
        elif etype == CANCEL_EVENT:
            self.cancel_requested(event)
        if etype in FREE_EVENTS and event.get("worker_id"):
            self.credit_freed(event["worker_id"])

    def cancel_requested(self, event: dict) -> int:
        """CancelTask flagged a running task (a ``TASK_CANCEL_REQUESTED`` event from any
        replica, this one included): write its lease id as a LeaseCancelled notice on
        every open stream of the lease's worker that accepts them
        (``LeaseRequest.accept_cancel_notices``), behind the tasks already waiting there.

        The lease id is rebuilt from the event (task id, queue, band, entry id, attempt,
        worker id, idempotency digest) and the session's owner tag, so it is the id that
        session's worker holds; a stream of the same worker id under another identity
        gets an id its worker does not hold and ignores. Best effort: a malformed event
        or a keyring not loaded yet sends nothing (the heartbeat answer reports the
        cancel anyway).

        Args:
            event: the decoded event (events_wire): ``task_id``, ``queue``, ``attempt``,
                ``worker_id``, and ``metadata`` with ``entry_id``, ``band`` and
                ``idem_digest``.

        Returns:
            The number of streams the notice was queued on.
        """
        sessions = self._by_worker.get(event.get("worker_id") or "")
        meta = event.get("metadata")
        if not sessions or not isinstance(meta, dict):
            return 0
        band, entry_id = str(meta.get("band", "")), str(meta.get("entry_id", ""))
        if len(band) != 1 or not band.isdigit() or not entry_id:
            return 0
        queued = 0
        for s in sessions:
            if not s.cancel_notices or s.closed:
                continue
            try:
                lease_id = Lease(event["task_id"], event["queue"], int(band), entry_id,
                                 int(event["attempt"]), s.worker_id,
                                 str(meta.get("idem_digest") or ""), s.owner
                                 ).encode(self.keyring)
            except (KeyError, TypeError, ValueError, RuntimeError):
                return queued  # RuntimeError: no lease secret loaded yet
            if not s.backlogged:
                s.out_since = time.monotonic()
            s.out.put_nowait(dtq_pb2.LeaseCancelled(lease_ids=[lease_id]))
            queued += 1
        return queued

    # -- sessions --------------------------------------------------------------------
    def register(self, session: Session) -> None:
        """Start feeding a session."""
        self.sessions[session.session_id] = session
        for q in session.queues:
            self._by_queue.setdefault(q, []).append(session)
        self._by_worker.setdefault(session.worker_id, []).append(session)
        self._notice_sessions += session.cancel_notices
        metrics.LEASE_SESSIONS.set(len(self.sessions))
        self._new_sessions.add(session.session_id)
        self._wake.set()

    async def unregister(self, session: Session) -> None:
        """Stop feeding a session and hand back leases it never delivered."""
        session.closed = True
        if self.sessions.pop(session.session_id, None) is not None:
            self._notice_sessions -= session.cancel_notices
            for index, name in [(self._by_queue, q) for q in session.queues] + \
                    [(self._by_worker, session.worker_id)]:
                listed = index.get(name, [])
                if session in listed:
                    listed.remove(session)
                if not listed:
                    index.pop(name, None)
        metrics.LEASE_SESSIONS.set(len(self.sessions))
        await self.activator.hand_back(session)

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
        """Start the dispatch loop (:class:`WakeLoop`: a round per wake-up and tick)."""
        self._loop.start()

    async def stop(self) -> None:
        """Stop the loop and end every session's stream."""
        self._limit_waker.cancel()
        await self._loop.stop()
        for s in list(self.sessions.values()):
            s.out.put_nowait(None)

    def stream_progress(self, session: Session) -> None:
        """The session's stream wrote a task (called by the Lease handler after each
        write): once ``out`` is empty, a read that was held back happens now."""
        session.out_since = time.monotonic()
        session.stuck = False
        if session.held_back and not session.backlogged and not session.closed:
            session.held_back = False
            self._dirty_workers.add(session.worker_id)
            self._wake.set()

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

    async def run_round(self, tick: bool = False) -> None:
        """Run one dispatch round now (the loop runs them on wake-ups and ticks).

        Public for tests, which drive the dispatcher round by round without starting
        its loop: first the read-aheads answered since the last round are delivered,
        then every woken session (every session on a ``tick``) is read. ``tick`` also
        runs the stream-health checks and ends the streams of draining workers.
        """
        await self._deliver_read_aheads()
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
            got, credit_left, _, queues_empty = await self.lease_now(session)
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
            for worker_id in await self.reader.draining({s.worker_id for s in skipped}):
                self.end_worker(worker_id)
        if tick:
            await self.health.release_unwritten()
            await self.health.check_streams()

    async def lease_now(self, session: Session) -> tuple[int, bool, int, bool]:
        """Read (and lease) for ``session`` now (:meth:`SessionReader.read`), then
        deliver; see :meth:`_after_read` for the reply. Public for tests (the loop
        calls it from :meth:`run_round`)."""
        return await self._after_read(session, await self.reader.read(session))

    async def _deliver_read_aheads(self) -> None:
        """Deliver the read-aheads answered since the last round."""
        reads, self._reads = self._reads, []
        for session, _, _ in reads:  # cleared first: a failed delivery must not strand one
            session.reading = False
        for session, queue, read in reads:
            if read is None or isinstance(read, BaseException):
                self.notify(queue)
                continue
            got, credit_left, _, _ = await self._after_read(session, read)
            if not got or not credit_left:
                # nothing for this session (taken elsewhere, paused, stalled) or it is
                # full now: the queue may hold more, let the round look at every session
                self.notify(queue)

    def _ahead_read(self, session: Session, queue: str,
                    read: LeaseRead | BaseException | None) -> None:
        """A read-ahead's outcome: delivered by the next round (None: its pipeline
        failed, the task is left to the next round's normal read)."""
        if read is None:
            session.reading = False
            self.notify(queue)
            return
        self._reads.append((session, queue, read))
        self._wake.set()

    async def _after_read(self, session: Session, read: LeaseRead
                          ) -> tuple[int, bool, int, bool]:
        """Deliver what a read took (see activation.py) and decide what comes next.

        Returns (leases delivered, whether the session had credit left, entries read,
        whether its queues hold nothing new for the group). Entries read but not
        delivered were put back (task-type filter or limit) or absorbed. The queues
        count as empty when every band stream was empty, or when a read with credit
        left returned no entry (XREADGROUP ``>`` is group-wide, so no other session of
        these queues would get one either).
        """
        limits, entries, live = read.limits, read.entries, read.live_streams
        self._limit_waker.throttled(limits.throttled, limits.wait_ms, metrics.RATE_LIMITED_READS)
        if read.worker_state and entries:
            # read in the same round trip as the check that says the worker may take
            # nothing: the entries go back to their queues
            await self.activator.deliver(session, read, put_back=True)
        if read.worker_state is WorkerState.DRAINING:
            self.end_worker(session.worker_id)
            return 0, False, 0, live == 0
        session.stalled = read.worker_state is WorkerState.STALLED
        if session.stalled:
            session.full = True  # read again at its next heartbeat here, or the tick
            return 0, False, 0, live == 0
        if read.missing_streams:
            self.groups.forget({session.where[s][0] for s in read.missing_streams})
            self._dirty_workers.add(session.worker_id)
            self._wake.set()
        credit = session.max_in_flight - read.pending - len(entries)
        session.full = credit <= 0
        if not entries:
            return 0, credit > 0, 0, live == 0 or credit > 0
        delivered = await self.activator.deliver(session, read)
        if delivered:
            session.limit_rounds = session.scan_rounds = 0
        if session.limit_held:
            credit = self._reread_after_limit(session, read.pending, delivered, read.cut)
        return delivered, credit > 0, len(entries), False

    def _reread_after_limit(self, session: Session, pending: int, delivered: int,
                            cut: bool = False) -> int:
        """Entries of a throttled task type (or of a type or required labels the
        session does not take) went back to the tail of their stream, so the credit
        they took is free again and other tasks may wait behind them: read again at
        once, at most LIMIT_REREADS times in a row (a stream of only throttled entries
        must not turn into a busy loop; the limit's timer or the tick reads it later),
        plus up to SCAN_REREADS times while lease_take's scan bound ``cut`` the read
        short. A read that delivered something resets the counts. Returns the credit
        left."""
        credit = session.max_in_flight - pending - delivered
        session.full = credit <= 0
        if credit <= 0:
            return credit
        if cut and session.scan_rounds < SCAN_REREADS:
            session.scan_rounds += 1
        elif session.limit_rounds < LIMIT_REREADS:
            session.limit_rounds += 1
        else:
            return credit
        self._dirty_workers.add(session.worker_id)
        self._wake.set()
        return credit
