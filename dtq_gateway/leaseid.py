"""Lease ids: the fencing token handed to workers.

A lease is (stream entry, consumer, attempt) of one task. The id is opaque to
workers but self-contained, so any gateway replica can check an Ack, Fail or
Heartbeat without local state::

    1|<task_id>|<queue>|<band>|<entry_id>|<attempt>|<worker_id>|<idem digest or ->

Queue names, worker ids and task ids are validated against alphabets without
``|``, so splitting is unambiguous. The idempotency digest is carried so that
terminal updates can name the idempotency record key up front (Lua receives
every key through KEYS).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dtq_gateway import keys
from dtq_gateway.errors import InvalidArgument

_VERSION = "1"
_ENTRY_RE = re.compile(r"^[0-9]{1,20}-[0-9]{1,20}\Z")
_DIGEST_RE = re.compile(r"^(-|[0-9a-f]{64})\Z")
_ATTEMPT_RE = re.compile(r"^(0|[1-9][0-9]{0,8})\Z")  # canonical: "01" is not attempt 1
MAX_LEN = 400


@dataclass(frozen=True, slots=True)
class Lease:
    """Decoded lease id."""

    task_id: str
    queue: str
    band: int
    entry_id: str
    attempt: int
    worker_id: str
    idem_digest: str  # "" when the task has no idempotency key

    def encode(self) -> str:
        """The wire form of this lease."""
        return "|".join((_VERSION, self.task_id, self.queue, str(self.band), self.entry_id,
                         str(self.attempt), self.worker_id, self.idem_digest or "-"))

    @property
    def tag(self) -> str:
        """``<queue>:<band>:<digest or ->``: what the scripts check against the task record
        (its queue, priority and idem_digest), so a lease id edited to name another
        queue, band or idempotency record is stale, not a way to reach another stream's
        entry with the same id or to skip the idempotency update."""
        return f"{self.queue}:{self.band}:{self.idem_digest or '-'}"

    @property
    def stream(self) -> str:
        """Band stream key holding the entry."""
        return keys.stream(self.queue, self.band)


def decode(lease_id: str, field: str = "lease_id") -> Lease:
    """Parse a lease id.

    Raises:
        InvalidArgument: malformed id (``field`` names the request field).
    """
    parts = lease_id.split("|") if len(lease_id) <= MAX_LEN else []
    if (len(parts) != 8 or parts[0] != _VERSION or not keys.TASK_ID_RE.match(parts[1])
            or not keys.QUEUE_RE.match(parts[2]) or parts[3] not in "0123456789"
            or len(parts[3]) != 1 or not _ENTRY_RE.match(parts[4]) or not _ATTEMPT_RE.match(parts[5])
            or not keys.WORKER_ID_RE.match(parts[6]) or not _DIGEST_RE.match(parts[7])):
        raise InvalidArgument(f"{field}: malformed lease id", field=field, reason="MALFORMED_LEASE")
    return Lease(parts[1], parts[2], int(parts[3]), parts[4], int(parts[5]), parts[6],
                 "" if parts[7] == "-" else parts[7])
