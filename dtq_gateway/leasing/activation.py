"""From a typed lease read to LeasedTask messages in a session's buffer.

The dispatcher (dispatch.py) decides who reads and when; an :class:`Activator` takes
what a read returned (:class:`~dtq_gateway.store.lease_replies.LeaseRead`): it finishes
the two-step path for entries lease_take left unactivated (task-type tokens, then
activate.lua), hands back rate-limit tokens taken for entries that were not leased,
builds the LeasedTask of each lease and puts it into the session's ``out`` within the
session's buffered-bytes cap (DTQ_LEASE_BUFFER_MAX_BYTES), releasing the rest.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable

from dtq_gateway import metrics, observe, tracing
from dtq_gateway.leasing.leaseid import Keyring, Lease
from dtq_gateway.leasing.sessions import Session
from dtq_gateway.settings import Settings
from dtq_gateway.store import leasing as store
from dtq_gateway.store import ratelimits
from dtq_gateway.store.client import Client
from dtq_gateway.store.lease_replies import ActivationKind, LeaseRead, ReadEntry
from dtq_proto import dtq_pb2

log = logging.getLogger(__name__)

OK, READ = ActivationKind.OK, ActivationKind.READ


class Activator:
    """Turns reads into leases delivered to sessions; accounts buffered payload bytes.

    Args:
        redis: the gateway's Redis client.
        settings: task_retention_s and lease_buffer_max_bytes are read.
        keyring: signs the lease ids handed out.
        release: ``release(lease_ids)`` hands leases back to their queues (no attempt
            spent).
        limit_waker: wakes a queue throttled by a task-type rate limit.
    """

    def __init__(self, redis: Client, settings: Settings, keyring: Keyring,
                 release: Callable[[list[str]], Awaitable[None]],
                 limit_waker: ratelimits.Waker) -> None:
        self.redis, self.settings, self.keyring = redis, settings, keyring
        self.release, self.limit_waker = release, limit_waker
        #: payload bytes in every session's ``out`` (dtq_lease_buffered_bytes)
        self.buffered_total = 0

    def buffered(self, session: Session, delta: int) -> None:
        """Account ``delta`` payload bytes put into (+) or taken from (-) ``session.out``."""
        session.buffered_bytes = max(0, session.buffered_bytes + delta)
        self.buffered_total = max(0, self.buffered_total + delta)
        metrics.LEASE_BUFFERED_BYTES.set(self.buffered_total)

    async def hand_back(self, session: Session) -> None:
        """Empty the ``out`` of a session that ended and release the leases it never
        delivered (no attempt spent; if that fails, the reaper reclaims them after the
        visibility timeout)."""
        undelivered, _ = session.take_unsent()
        self.buffered(session, -session.buffered_bytes)
        if undelivered:
            try:
                await self.release(undelivered)
            except Exception:  # noqa: BLE001 - the reaper reclaims them if this fails
                log.warning("could not release undelivered leases",
                            extra={"worker_id": session.worker_id, "count": len(undelivered)})

    async def deliver(self, session: Session, read: LeaseRead, put_back: bool = False) -> int:
        """Deliver what ``read`` took for ``session``; returns the leases delivered.

        ``put_back``: the worker may take nothing (stalled, draining): entries leased by
        the read are released and unactivated ones put back at the tail of their band
        (no attempt spent either way); nothing is delivered.
        """
        await self.keyring.ensure()
        entries = await self._finish(session, read, put_back)
        tasks = [self._leased_task(session, e) for e in entries if e.activation.kind is OK]
        for e in entries:
            if e.activation.kind is ActivationKind.EXPIRED:
                observe.expired(e.queue)
        if not put_back:
            _reread_after_put_backs(session, entries)
        if put_back or session.closed:
            # the worker takes nothing, or the stream ended while this batch was being
            # activated: hand the leases back
            if tasks:
                await self.release([t.lease_id for t in tasks])
            return 0
        return await self._buffer(session, tasks)

    async def _finish(self, session: Session, read: LeaseRead, put_back: bool
                      ) -> list[ReadEntry]:
        """Activate the entries the read left unactivated (task-type tokens first) and
        give back the tokens of entries not leased. Returns every entry, activated."""
        entries = list(read.entries)
        todo = [i for i, e in enumerate(entries) if e.activation.kind is READ]
        limits = read.limits
        session.limit_held = 0
        if not todo:
            if put_back:  # leased by lease_take, released by deliver: tokens back
                await self._give_back(limits, [(e, False) for e in entries
                                               if e.activation.kind is OK])
            return entries
        modes = ["r" if put_back or (session.task_types
                                     and entries[i].task_type not in session.task_types)
                 or not labels_ok(session.labels, entries[i].fields)
                 else "a" for i in todo]
        held = set() if put_back else await self._hold_throttled_types(
            [entries[i] for i in todo], modes, limits)
        session.limit_held = len(held)
        done = await store.activate(self.redis, session.worker_id,
                                    self.settings.task_retention_s,
                                    [entries[i] for i in todo], modes)
        for i, e in zip(todo, done):
            entries[i] = e
        # lease_take returned its own entries' queue-wide tokens; these took type tokens
        # too unless they were held back or put back
        back = [(entries[i], modes[k] == "a" and k not in held) for k, i in enumerate(todo)
                if put_back or entries[i].activation.kind is not OK]
        if put_back:
            back += [(e, False) for e in entries if e.activation.kind is OK]
        await self._give_back(limits, back)
        return entries

    async def _give_back(self, limits: ratelimits.Limits,
                         entries: list[tuple[ReadEntry, bool]]) -> None:
        """Return the queue-wide token (and, where the flag says so, the task-type
        token) each entry took, for entries that were not leased."""
        returns: dict[str, Counter[str]] = {}
        for e, typed_token in entries:
            if e.queue not in limits.limited:
                continue
            back = returns.setdefault(e.queue, Counter())
            back[ratelimits.QUEUE_SCOPE] += 1
            if typed_token and e.queue in limits.typed:
                back[e.task_type] += 1
        if returns:
            await ratelimits.give_back(self.redis, returns)

    async def _hold_throttled_types(self, entries: list[ReadEntry], modes: list[str],
                                    limits: ratelimits.Limits) -> set[int]:
        """Take task-type tokens for the entries about to be activated; an entry that
        gets none is switched to mode ``r`` (put back, still queued, no attempt spent).
        Returns the positions (in ``entries``) of the entries held back."""
        wanted = [(i, (e.queue, e.task_type)) for i, e in enumerate(entries)
                  if modes[i] == "a" and e.queue in limits.typed]
        if not wanted:
            return set()
        granted, waits = await ratelimits.take_types(self.redis, [w for _, w in wanted])
        held = {i for (i, _), ok in zip(wanted, granted) if not ok}
        for i in held:
            modes[i] = "r"
        for queue, wait_ms in waits.items():
            count = sum(1 for i, (q, _) in wanted if q == queue and i in held)
            self.limit_waker.throttled({queue}, wait_ms, metrics.RATE_LIMITED_TASKS, count)
        return held

    async def _buffer(self, session: Session, tasks: list[dtq_pb2.LeasedTask]) -> int:
        """Put ``tasks`` into ``session.out`` within the buffered-bytes cap; release
        the rest. Returns how many were put."""
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

    def _leased_task(self, session: Session, e: ReadEntry) -> dtq_pb2.LeasedTask:
        """The LeasedTask of an entry leased to ``session`` (its lease id signed)."""
        a = e.activation
        lease = Lease(e.task_id, e.queue, e.band, e.entry_id, e.attempt, session.worker_id,
                      store.entry_idem_digest(e.fields), session.owner)
        metadata = a.metadata()
        return dtq_pb2.LeasedTask(
            lease_id=lease.encode(self.keyring), task_id=e.task_id, queue=e.queue,
            task_type=e.task_type, payload=e.payload, content_type=a.content_type,
            priority=e.band, attempt=e.attempt,
            max_attempts=int(e.fields["max_attempts"]),
            timeout_ms=int(e.fields["timeout_ms"]),
            idempotency_key=e.text("idempotency_key"), metadata=metadata,
            created_at_ms=a.created_at_ms, leased_at_ms=a.leased_at_ms,
            traceparent=metadata.get("traceparent", ""),
            tracestate=metadata.get("tracestate", ""))


def labels_ok(labels: dict[str, str], fields: dict) -> bool:
    """Whether a session with ``labels`` may lease the entry with ``fields``: it has
    every pair of the entry's required labels (field ``req_labels``, a JSON object;
    docs/fairness.md). An entry without them, or with a value dtq did not write, may be
    leased by anyone."""
    raw = fields.get("req_labels") or fields.get(b"req_labels")
    if not raw:
        return True
    try:
        need = json.loads(raw)
    except ValueError:
        return True
    return not isinstance(need, dict) or all(labels.get(k) == v for k, v in need.items())


def _reread_after_put_backs(session: Session, entries: list[ReadEntry]) -> None:
    """Entries not leased but put back (task type or required labels the session lacks)
    or parked (their concurrency key at its limit) freed the credit they took, and what
    waits behind them may be for this session: count them in ``limit_held`` so the
    dispatcher reads again. Parking takes entries out of their stream, so a read after
    it always gets further: it does not count as one of the LIMIT_REREADS rounds
    (docs/fairness.md)."""
    parked = sum(1 for e in entries if e.activation.kind is ActivationKind.PARKED)
    session.limit_held += parked + sum(
        1 for e in entries if e.activation.kind is ActivationKind.REQUEUED)
    if parked:
        session.limit_rounds = 0
