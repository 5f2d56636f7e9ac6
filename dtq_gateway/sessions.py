"""Lease sessions and read-ahead: what the dispatcher (dispatch.py) feeds.

A :class:`Session` is one open Lease stream: its worker, queues, credit and the
queue of LeasedTask messages its stream yields. A :class:`ReadAhead` is the
``lease_read`` of an idle session riding in an enqueue's Redis round trip.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dtq_gateway import keys
from dtq_gateway.scripts import Script

if TYPE_CHECKING:
    from dtq_gateway.dispatch import Dispatcher

LEASE_READ = Script("lease_read", helpers=("_bucket",))


@dataclass(eq=False)
class Session:
    """One open Lease stream. ``out`` carries LeasedTask messages (None = end)."""

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
    #: the last read found the worker's heartbeat too old (see lease_read.lua)
    stalled: bool = False
    closed: bool = False
    #: set when the stream ends because the worker said it is draining (ends with OK)
    worker_draining: bool = False
    #: a lease_read for this session rides in an enqueue's round trip (see ReadAhead)
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
    #: band streams, band-major p9 first, and the full KEYS of lease_read (fixed per session)
    streams: list[str] = field(init=False)
    read_keys: list[str] = field(init=False)

    @property
    def backlogged(self) -> bool:
        """True while tasks wait in ``out`` for the stream to write them."""
        return not self.out.empty()

    def read_cap(self, most: int) -> int:
        """Most entries one lease_read may take for this session (``most`` = the
        dispatcher's per-read bound)."""
        return min(most, self.concurrency) if self.concurrency > 0 else most

    def __post_init__(self) -> None:
        self.streams = [keys.stream(q, b) for b in keys.BANDS_DESC for q in self.queues]
        self.read_keys = ([keys.paused(q) for q in self.queues]
                          + [keys.rate_limit(q) for q in self.queues] + self.streams
                          + [keys.worker(self.worker_id)])


class ReadAhead:
    """A ``lease_read`` for one idle session, pipelined behind a unary enqueue.

    A task enqueued through this gateway for a queue with an idle Lease session is
    read for that session in the enqueue's own round trip (the read runs after the
    enqueue in Redis), so reaching the worker costs one Redis round trip less: the
    dispatcher only activates. Made by :meth:`Dispatcher.read_ahead`; the caller adds
    ``script``/``keys``/``args`` to its pipeline, then calls exactly one of
    :meth:`deliver` (with the reply, or the exception the call returned) or
    :meth:`cancel` (the pipeline failed).
    """

    __slots__ = ("args", "dispatcher", "keys", "queue", "script", "session")

    def __init__(self, dispatcher: Dispatcher, session: Session, queue: str) -> None:
        self.dispatcher, self.session, self.queue = dispatcher, session, queue
        self.script = LEASE_READ
        self.keys, self.args = dispatcher._read_call(session)

    def deliver(self, reply: Any) -> None:
        """Hand the lease_read reply to the dispatcher loop (which activates)."""
        self.dispatcher._reads.append((self, reply))
        self.dispatcher._wake.set()

    def cancel(self) -> None:
        """The pipeline failed: the task is left to the dispatcher's normal round."""
        self.session.reading = False
        self.dispatcher.notify(self.queue)
