"""Lease sessions and read-ahead: what the dispatcher (dispatch.py) feeds.

A :class:`Session` is one open Lease stream: its worker, queues, credit and the
queue of LeasedTask messages its stream yields. A :class:`ReadAhead` is the
``lease_take`` (read and activation) of an idle session riding in an enqueue's Redis
round trip. Neither knows the dispatcher: a ReadAhead gets the two callables it needs.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dtq_gateway.store.lease_replies import LeaseRead
from dtq_gateway.store.leasing import (
    Call,
    SlotRead,
    decode_check_and_take,
    queue_check_and_take,
    session_layout,
)
from dtq_proto import dtq_pb2

__all__ = ["WINDOW_MIN", "WINDOW_UNSAID", "ReadAhead", "Session", "SlotRead"]

#: Smallest unread window of a Lease stream that said its concurrency, and the window
#: of one that did not (see Session.window).
WINDOW_MIN = 4
WINDOW_UNSAID = 16


@dataclass(eq=False)
class Session:
    """One open Lease stream. ``out`` carries LeasedTask messages, LeaseCancelled notices
    when the worker accepts them (``cancel_notices``) and, last, None (the end)."""

    worker_id: str
    queues: list[str]
    max_in_flight: int
    task_types: frozenset[str] = frozenset()
    #: the worker's handler slots (LeaseRequest.concurrency, 0 = not said): one read
    #: takes at most this many entries, so a burst is shared by the idle sessions of a
    #: queue instead of filling the first one's buffer up to max_in_flight
    concurrency: int = 0
    #: LeaseRequest.labels (shown by the web dashboard for workers of this replica)
    labels: dict[str, str] = field(default_factory=dict)
    #: leaseid.owner_tag of the identity that opened the stream: its leases carry it
    owner: str = ""
    session_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    out: asyncio.Queue = field(default_factory=asyncio.Queue)
    full: bool = False
    #: the last read found the worker's heartbeat too old (see worker_check.lua)
    stalled: bool = False
    closed: bool = False
    #: set when the stream ends because the worker said it is draining (ends with OK)
    worker_draining: bool = False
    #: LeaseRequest.accept_cancel_notices: ``out`` also carries LeaseCancelled notices
    #: (Dispatcher.cancel_requested), written in order between the tasks
    cancel_notices: bool = False
    #: a lease_take for this session rides in an enqueue's round trip (see ReadAhead)
    reading: bool = False
    #: write pacing: when the stream last took a task from ``out`` (or ``out`` last went
    #: from empty to non-empty), monotonic s; and whether a read was skipped because the
    #: stream had not written what it already had
    out_since: float = 0.0
    held_back: bool = False
    #: leases were released because the stream wrote nothing for too long: no read for
    #: this session until its stream writes again
    stuck: bool = False
    #: payload bytes of the tasks in ``out`` (bounded by DTQ_LEASE_BUFFER_MAX_BYTES)
    buffered_bytes: int = 0
    #: entries of the last activation put back by a task-type rate limit, and how many
    #: reads in a row were re-run at once for that (bounded, see Dispatcher._after_read)
    limit_held: int = 0
    limit_rounds: int = 0
    #: reads in a row re-run at once because lease_take's scan bound cut the last one
    #: short (bounded by SCAN_REREADS, see Dispatcher._reread_after_limit)
    scan_rounds: int = 0
    #: stream health (Dispatcher.received, Dispatcher._check_streams): the leases handed
    #: to the stream and not yet confirmed received, in write order: lease id -> (write
    #: sequence number, monotonic s of the hand-over). A lease is confirmed when it, or
    #: one written after it (a stream delivers in order), shows up in a heartbeat, an
    #: Ack or a Fail, here or through Redis from another replica
    unread: dict[str, tuple[int, float]] = field(default_factory=dict)
    sent_seq: int = 0
    #: monotonic s of the last receipt (0 = none yet)
    receipt_at: float = 0.0
    #: a read was skipped because the unread window was full: read again on a receipt
    window_held: bool = False
    #: the stream stopped reading (no receipt for StreamHealth.stall_after_s): its unread
    #: leases were released and its Lease call is being ended (UNAVAILABLE)
    not_reading: bool = False
    #: the Lease handler's task (cancelled to end a stream that stopped reading)
    handler: asyncio.Task | None = None
    #: read the queues slot by slot (Redis Cluster: a script's keys share one slot);
    #: False (standalone or Sentinel Redis) reads every queue in one lease_take call
    read_by_slot: bool = True
    #: band streams, band-major p9 first, the queues by hash slot (each slot read
    #: is one lease_take call; a single-queue session, or any session when
    #: ``read_by_slot`` is False, has one), and the queue and band of each stream
    #: (store.leasing.session_layout)
    streams: list[str] = field(init=False)
    slot_reads: list[SlotRead] = field(init=False)
    where: dict[str, tuple[str, int]] = field(init=False)

    @property
    def backlogged(self) -> bool:
        """True while tasks wait in ``out`` for the stream to write them."""
        return not self.out.empty()

    def take_unsent(self) -> tuple[list[str], bool]:
        """Empty ``out``: the lease ids of the LeasedTasks still in it, and whether the
        end marker (None) was. Cancel notices are dropped: the heartbeat answer reports
        those cancels too."""
        ids, ended = [], False
        while not self.out.empty():
            item = self.out.get_nowait()
            if item is None:
                ended = True
            elif isinstance(item, dtq_pb2.LeasedTask):
                ids.append(item.lease_id)
        return ids, ended

    @property
    def window(self) -> int:
        """Most leases the stream may hold written but unconfirmed, plus those waiting
        in ``out``: 2 × concurrency, at least ``WINDOW_MIN`` (a worker's default
        max_in_flight is 2 × concurrency, so the window only binds a reader that asks
        for more than it runs); ``WINDOW_UNSAID`` when the LeaseRequest did not say its
        concurrency."""
        if self.concurrency <= 0:
            return WINDOW_UNSAID
        return max(2 * self.concurrency, WINDOW_MIN)

    def window_room(self) -> int:
        """Leases the stream may still take before its unread window is full (>= 0).

        A session whose max_in_flight is within its window is never bound by it (its
        unread leases are among the leases it holds): the credit alone paces it."""
        if self.max_in_flight <= self.window:
            return self.max_in_flight
        return max(0, self.window - len(self.unread) - self.out.qsize())

    def read_cap(self, most: int) -> int:
        """Most entries one lease_take may take for this session (``most`` = the
        dispatcher's per-read bound), at most the room left in its unread window
        (at least 1: a session with no room is not read at all)."""
        cap = min(most, self.concurrency) if self.concurrency > 0 else most
        if self.max_in_flight <= self.window:
            return cap
        return max(1, min(cap, self.window_room()))

    def handed(self, lease_id: str, now: float) -> None:
        """The stream is about to write ``lease_id``: it is unread until confirmed."""
        self.sent_seq += 1
        self.unread[lease_id] = (self.sent_seq, now)

    def confirm(self, lease_ids, now: float) -> bool:
        """Cumulative receipt: the newest of ``lease_ids`` written to this stream, and
        every lease written before it, were received. True when anything was confirmed."""
        unread = self.unread
        newest = 0
        for lid in lease_ids:
            seen = unread.get(lid)
            if seen is not None and seen[0] > newest:
                newest = seen[0]
        if not newest:
            return False
        while unread:
            first = next(iter(unread))
            if unread[first][0] > newest:
                break
            del unread[first]
        self.receipt_at = now
        return True

    def __post_init__(self) -> None:
        layout = session_layout(self.queues, self.read_by_slot)
        self.streams, self.slot_reads, self.where = (layout.streams, layout.slot_reads,
                                                     layout.where)


#: ``deliver(session, queue, read)`` of a :class:`ReadAhead`: the read's outcome, or
#: the error of its calls, or None when the pipeline carrying them failed.
Deliver = Callable[["Session", str, "LeaseRead | BaseException | None"], None]


class ReadAhead:
    """A ``worker_check`` + ``lease_take`` for one idle session of one slot read,
    pipelined behind a unary enqueue (one ``lease_take`` that checks the worker itself
    on a standalone or Sentinel-managed Redis).

    A task enqueued through this gateway for a queue with an idle Lease session is
    read and activated for that session in the enqueue's own round trip (the calls run
    after the enqueue in Redis), so reaching the worker costs no round trip of its own:
    the dispatcher only builds the LeasedTasks. Made by :meth:`Dispatcher.read_ahead`;
    the caller adds the calls to its pipeline with :meth:`queue_calls`, then calls
    exactly one of :meth:`deliver` (with their replies, or the exceptions the calls
    returned) or :meth:`cancel` (the pipeline failed).

    Args:
        session: the session read for (its only slot read).
        queue: the queue the enqueue wrote to.
        calls: ``calls(session)`` -> (worker_check call or None, lease_take call).
        deliver: see :data:`Deliver`.
    """

    __slots__ = ("_calls", "_deliver", "queue", "session")

    def __init__(self, session: Session, queue: str,
                 calls: Callable[[Session], tuple[Call | None, Call]],
                 deliver: Deliver) -> None:
        self.session, self.queue = session, queue
        self._calls, self._deliver = calls, deliver

    def queue_calls(self, pipe: Any) -> int:
        """Add worker_check (where it is a call of its own) and lease_take to ``pipe``
        (the enqueue's ``store.scripts.ScriptPipeline``); returns how many calls (2,
        or 1)."""
        return queue_check_and_take(pipe, *self._calls(self.session))

    def deliver(self, replies: list[Any]) -> None:
        """Hand the replies (check, take; or take alone), decoded, to the dispatcher."""
        read: LeaseRead | BaseException
        try:
            read = decode_check_and_take(self.session.slot_reads[0], replies)
        except Exception as exc:  # noqa: BLE001 - a call's error: the round retries
            read = exc
        self._deliver(self.session, self.queue, read)

    def cancel(self) -> None:
        """The pipeline failed: the task is left to the dispatcher's normal round."""
        self._deliver(self.session, self.queue, None)
