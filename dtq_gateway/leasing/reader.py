"""How a Lease session is read: worker_check and lease_take calls, slot by slot.

The dispatcher (dispatch.py) decides which session reads and when; a
:class:`SessionReader` sends the calls for one session and returns what they leased as
one :class:`~dtq_gateway.store.lease_replies.LeaseRead`: one script call for a session
on a standalone or Sentinel-managed Redis (lease_take checks the worker itself), one
round trip (worker_check + lease_take) for a cluster session whose queues share a hash
slot, a peek and then one call per (band, slot) holding entries for a session over
several slots of a cluster, so strict p9 -> p0 and max_in_flight hold across slots.
"""

from __future__ import annotations

from dtq_gateway.leasing.sessions import Session
from dtq_gateway.settings import Settings
from dtq_gateway.store import leasing as store
from dtq_gateway.store.client import Client
from dtq_gateway.store.groups import Groups
from dtq_gateway.store.lease_replies import ActivationKind, LeaseRead, WorkerState
from dtq_gateway.store.leasing import Call, SlotRead, TakeArgs

#: Most entries one lease_take returns (bounds script run time).
BATCH_MAX = 256
#: Outcomes of a read entry that keep the credit it took: leased, or left for the
#: two-step path (activate.lua)
HOLDS_CREDIT = frozenset({ActivationKind.OK, ActivationKind.READ})


class SessionReader:
    """Sends a session's worker_check and lease_take calls (or one lease_take that
    checks the worker itself, standalone or Sentinel Redis).

    Args:
        redis: the gateway's Redis client.
        settings: heartbeat interval, visibility timeout, task retention.
        groups: the consumer groups known to exist (created on a session's first read).
    """

    def __init__(self, redis: Client, settings: Settings, groups: Groups) -> None:
        self.redis, self.settings, self.groups = redis, settings, groups
        #: A worker whose last heartbeat is older than this gets no new leases (ms):
        #: two heartbeat intervals (the WORKER_STALE rule), at most the visibility timeout.
        self.stale_after_ms = min(2 * settings.heartbeat_interval_ms,
                                  settings.visibility_timeout_ms)

    def take_call(self, session: Session, read: SlotRead, most: int | None = None,
                   max_in_flight: int | None = None, check: bool = False) -> Call:
        """KEYS and ARGV of a lease_take of one slot read of ``session`` (``most``:
        default its read cap; 0 = peek; ``check``: the call checks the worker itself,
        standalone or Sentinel Redis only)."""
        who = TakeArgs(session.worker_id, session.max_in_flight, session.task_types,
                       self.settings.task_retention_s, tuple(sorted(session.labels.items())))
        return store.lease_take_call(read, who, session.read_cap(BATCH_MAX)
                                     if most is None else most, max_in_flight,
                                     check_ms=self.stale_after_ms if check else None)

    def ahead_calls(self, session: Session) -> tuple[Call | None, Call]:
        """A read-ahead's calls: the worker_check and lease_take of ``session``; no
        worker_check (None) where the lease_take checks the worker itself (a session
        that does not read by slot: standalone or Sentinel Redis)."""
        read = session.slot_reads[0]
        if not session.read_by_slot:
            return None, self.take_call(session, read, check=True)
        return (store.worker_check_call(session.worker_id, self.stale_after_ms),
                self.take_call(session, read))

    async def read(self, session: Session) -> LeaseRead:
        """worker_check + lease_take for ``session`` now: what it leased, decoded.

        On a standalone or Sentinel-managed Redis (``session.read_by_slot`` False) one
        lease_take call checks the worker first and reads only when it may take work:
        a stalled or draining worker's read leases nothing (the call counts pending
        and the non-empty streams, as a peek) and reports the state.

        On a cluster (the worker's record is in the ``{workers}`` slot) a session with
        one slot read (its queues share a hash slot) costs one round trip:
        worker_check and lease_take in one pipeline. lease_take activates what it reads, so a check
        that says the worker may take nothing comes too late for that read: its leases
        are released (see Activator.deliver). A session whose last check said
        ``stalled`` therefore first peeks (check and lease_take reading nothing, one
        round trip) and takes only once its worker is back, so a stalled worker's
        sessions cost no activation and release per tick.

        On a cluster, queues in several slots are read slot by slot: first the check
        and every slot's peek (one pipeline), then the non-empty (band, slot) pairs
        from p9 down, each with the credit the earlier ones left, so strict priority
        holds across slots too (one round trip per pair).
        """
        await self.groups.ensure(self.redis, session.queues)
        if not session.read_by_slot:
            read = session.slot_reads[0]
            return await store.lease_take(self.redis, read,
                                          self.take_call(session, read, check=True))
        check = store.worker_check_call(session.worker_id, self.stale_after_ms)
        single = len(session.slot_reads) == 1
        if single and not session.stalled:
            read = session.slot_reads[0]
            state, (got,) = await store.check_and_take(
                self.redis, check, [(read, self.take_call(session, read))])
            return got.with_state(state)
        state, peeks = await store.check_and_take(
            self.redis, check, [(r, self.take_call(session, r, most=0))
                                for r in session.slot_reads], peek=True)
        if state:
            return LeaseRead.merge(peeks, state)
        if single:  # its worker is back: take now
            read = session.slot_reads[0]
            return await store.lease_take(self.redis, read, self.take_call(session, read))
        return await self._take_by_band(session, peeks)

    async def _take_by_band(self, session: Session, peeks: list[LeaseRead]) -> LeaseRead:
        """Strict p9 -> p0 across slots: one lease_take per (band, slot read) whose
        peek found entries, each with the credit the earlier ones left."""
        pending = sum(p.pending for p in peeks)
        credit = min(session.max_in_flight - pending, session.read_cap(BATCH_MAX))
        live = sorted(((session.where[stream][1], n) for n, peek in enumerate(peeks)
                       if not peek.missing_streams for stream in peek.live),
                      key=lambda x: (-x[0], x[1]))
        reads = [LeaseRead(0, p.missing_streams, WorkerState.OK, p.live_streams, p.limits)
                 for p in peeks]
        done: set[tuple[int, int]] = set()
        for band, n in live:
            if credit <= 0 or (band, n) in done:
                continue
            done.add((band, n))
            sub = session.slot_reads[n].band(band)
            got = await store.lease_take(self.redis, sub, self.take_call(
                session, sub, most=credit, max_in_flight=peeks[n].pending + credit))
            # entries put back (or otherwise not leased) freed their credit
            credit -= sum(1 for e in got.entries if e.activation.kind in HOLDS_CREDIT)
            reads.append(LeaseRead(0, got.missing_streams, WorkerState.OK, 0, got.limits,
                                   got.entries, cut=got.cut))
        return LeaseRead.merge(reads, pending=pending)

    async def draining(self, worker_ids: set[str]) -> list[str]:
        """The workers among ``worker_ids`` whose record says ``draining``.

        A worker's Heartbeat(draining) may reach another replica; worker_check notices
        it only when it runs for the session, so the dispatcher's tick asks for the
        sessions it skipped: one worker_states call (one round trip, one reply) per
        1,000 workers.
        """
        workers = sorted(worker_ids)
        out = []
        for i in range(0, len(workers), 1000):
            chunk = workers[i:i + 1000]
            states = await store.worker_states(self.redis, chunk)
            out += [w for w, status in zip(chunk, states) if status == "draining"]
        return out
