"""Typed replies of the lease scripts (worker_check, lease_take, activate).

Each wrapper in :mod:`dtq_gateway.store.leasing` decodes its script's reply into these
values in one place, so no caller indexes a raw reply.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field, replace
from typing import Any

from dtq_gateway.store.ratelimits import Limits
from dtq_gateway.store.replies import text as as_text


class WorkerState(enum.IntEnum):
    """worker_check.lua's answer for a session's worker."""

    #: heartbeating: it may take leases
    OK = 0
    #: its last heartbeat is older than the stale threshold: no new leases for now
    STALLED = 1
    #: it said it is draining: its streams end
    DRAINING = 2


class ActivationKind(enum.Enum):
    """What the activation of one entry read did (activate.lua / lease_take.lua)."""

    #: leased to the consumer: a LeasedTask is due
    OK = "ok"
    #: a stale or duplicate entry (its task moved on, or its record is gone): dropped
    ABSORBED = "absorbed"
    #: the task was cancelled while queued: its entry was dropped
    CANCELLED = "cancelled"
    #: the task's expiry passed before it started: it ended as expired here
    EXPIRED = "expired"
    #: put back at the tail of its band, still queued (task type not taken, throttled)
    REQUEUED = "requeued"
    #: read but not activated yet (the two-step path: see lease_take.lua's header)
    READ = "read"
    #: its concurrency key is at the queue's per-key limit: out of its band, waiting in
    #: the key's parked list, still queued (docs/fairness.md)
    PARKED = "parked"


@dataclass(frozen=True, slots=True)
class Activation:
    """One entry's activation. The other fields are set only for kind OK:
    ``metadata_json`` is the task's metadata (JSON object text, "" for none),
    ``created_at_ms`` / ``leased_at_ms`` epoch ms (Redis TIME)."""

    kind: ActivationKind
    content_type: str = ""
    metadata_json: str = ""
    created_at_ms: int = 0
    leased_at_ms: int = 0

    @classmethod
    def decode(cls, reply: list[Any]) -> Activation:
        """From ``{'ok', content_type, metadata, created_at_ms, leased_at_ms}`` or
        ``{kind}``. Raises ValueError for an unknown kind."""
        kind = ActivationKind(as_text(reply[0]))
        if kind is not ActivationKind.OK:
            return cls(kind)
        return cls(kind, as_text(reply[1]), as_text(reply[2]), int(reply[3] or 0),
                   int(reply[4]))

    def metadata(self) -> dict[str, Any]:
        """The task's metadata as a dict ({} without any)."""
        return json.loads(self.metadata_json) if self.metadata_json else {}


NOT_ACTIVATED = Activation(ActivationKind.READ)


@dataclass(frozen=True, slots=True)
class ReadEntry:
    """One band stream entry a lease script read for a consumer.

    ``fields`` maps the entry's field names to their raw values (bytes); ``activation``
    is what became of it (kind READ: not activated yet).
    """

    stream: str
    queue: str
    band: int
    entry_id: str
    fields: dict[str, Any]
    activation: Activation = NOT_ACTIVATED

    def text(self, name: str) -> str:
        """A field as text ("" when absent)."""
        return as_text(self.fields.get(name))

    @property
    def task_id(self) -> str:
        return self.text("task_id")

    @property
    def task_type(self) -> str:
        return self.text("task_type")

    @property
    def attempt(self) -> int:
        return int(self.fields["attempt"])

    @property
    def payload(self) -> bytes:
        raw = self.fields.get("payload", b"")
        return raw if isinstance(raw, bytes) else str(raw).encode()

    @property
    def queued_at_ms(self) -> int:
        """Epoch ms the task began to wait: the ``queued_at`` field (an entry put back
        unleased keeps the first one), else the time in the entry id."""
        raw = self.fields.get("queued_at")
        return int(raw) if raw else int(self.entry_id.split("-", 1)[0])

    def activated(self, activation: Activation) -> ReadEntry:
        """This entry with its activation."""
        return replace(self, activation=activation)


@dataclass(frozen=True, slots=True)
class LeaseRead:
    """A lease_take reply, or the merge of a session's replies.

    Attributes:
        pending: leases the consumer held before the read (its PEL entries).
        missing_streams: band stream keys whose consumer group is missing (the queue
            was deleted or never set up): not read.
        worker_state: the worker check's answer (worker_check.lua's, or lease_take's
            own when the call checked the worker; OK when no check ran).
        live_streams: band streams holding entries (0 = every queue read is empty).
        limits: the rate-limit part (queue names: typed, limited, throttled; wait_ms).
        entries: the entries read, strict p9 -> p0.
        live: a peek's non-empty band stream keys (empty for a read).
        cut: the call's scan bound (lease_take.lua, SCAN_MAX entries read in all) ended
            it while it had credit left: more may be readable for the session.
    """

    pending: int
    missing_streams: list[str]
    worker_state: WorkerState
    live_streams: int
    limits: Limits
    entries: list[ReadEntry] = field(default_factory=list)
    live: list[str] = field(default_factory=list)
    cut: bool = False

    def with_state(self, state: WorkerState) -> LeaseRead:
        return replace(self, worker_state=state)

    @staticmethod
    def merge(reads: list[LeaseRead], state: WorkerState = WorkerState.OK,
              pending: int | None = None) -> LeaseRead:
        """One value for a whole session from its slot reads: counts summed (``pending``
        given: that instead), lists joined, the earliest rate-limit wake-up kept, cut
        when any read was."""
        waits = [r.limits.wait_ms for r in reads if r.limits.wait_ms]
        return LeaseRead(
            sum(r.pending for r in reads) if pending is None else pending,
            [s for r in reads for s in r.missing_streams], state,
            sum(r.live_streams for r in reads),
            Limits(min(waits) if waits else 0,
                   set().union(*(r.limits.typed for r in reads)),
                   set().union(*(r.limits.limited for r in reads)),
                   set().union(*(r.limits.throttled for r in reads))),
            [e for r in reads for e in r.entries], [s for r in reads for s in r.live],
            any(r.cut for r in reads))


def decode_read(reply: list[Any], queues: list[str], streams: list[str],
                where: list[tuple[str, int]], peek: bool = False) -> LeaseRead:
    """Decode lease_take.lua's reply for a call that read
    ``streams`` (``where``: queue and band of each) of ``queues``; its worker state
    (item 6) is OK unless the call checked the worker (``lease_take_call``'s
    ``check_ms``)."""
    entries = []
    if not peek:
        for item in reply[6:]:
            i = int(item[0]) - 1
            raw = item[2]
            fields = {as_text(raw[k]): raw[k + 1] for k in range(0, len(raw), 2)}
            act = Activation.decode(item[3]) if len(item) > 3 else NOT_ACTIVATED
            entries.append(ReadEntry(streams[i], *where[i], as_text(item[1]), fields, act))
    return LeaseRead(
        int(reply[0]), [streams[int(i) - 1] for i in reply[1]], WorkerState(int(reply[5])),
        int(reply[3]), Limits.from_reply(reply[4], queues), entries,
        [streams[int(i) - 1] for i in reply[6]] if peek and len(reply) > 6 else [],
        not peek and int(reply[2]) == 1)
