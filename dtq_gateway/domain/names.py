"""Names and ids of the domain: the alphabets of queue names, worker ids, task types,
task ids and schedule names, the slot tag a task id carries, and the digests of
idempotency keys.

A leaf: pure functions over strings, importing nothing of dtq. The store's key layout
(:mod:`dtq_gateway.store.keys`) builds its key names from these, and validation,
schedule and follow-up planning check requests against them without importing the
store.
"""

from __future__ import annotations

import binascii
import hashlib
import re
import uuid
from functools import cache

QUEUE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}\Z")
WORKER_ID_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,128}\Z")
#: A task id: 32 lowercase hex characters, then ``-`` and the slot tag of its queue (1-4
#: characters of [0-9a-z]). Ids without the tag (the layout before hash tags) are still
#: accepted: their records keep the untagged keys (a standalone Redis only).
TASK_ID_RE = re.compile(r"^[0-9a-f]{32}(?:-[0-9a-z]{1,4})?\Z")
TASK_TYPE_RE = re.compile(r"^[A-Za-z0-9_.:/-]{1,128}\Z")

#: Schedule names follow the queue-name alphabet (no ':', so keys never collide).
SCHEDULE_RE = QUEUE_RE
_SLOTS = 16384
_TAG_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


def key_slot(key: str) -> int:
    """Redis Cluster hash slot of ``key`` (CRC16 of its hash tag, or of the whole key
    when it has none), 0..16383."""
    raw = key.encode()
    start = raw.find(b"{")
    if start >= 0:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1:end]
    return binascii.crc_hqx(raw, 0) % _SLOTS


@cache
def _slot_tags() -> tuple[str, ...]:
    """For each of the 16384 slots the shortest base-36 string (first in counting order)
    whose CRC16 lands in it: 1 to 4 characters. Built once (about 0.1 s)."""
    table: list[str | None] = [None] * _SLOTS
    left, n = _SLOTS, 0
    while left:
        digits, m = "", n
        while True:
            digits = _TAG_ALPHABET[m % 36] + digits
            m //= 36
            if not m:
                break
        slot = binascii.crc_hqx(digits.encode(), 0) % _SLOTS
        if table[slot] is None:
            table[slot] = digits
            left -= 1
        n += 1
    return tuple(t for t in table if t is not None)


def slot_tag(queue: str) -> str:
    """The task-id slot tag of ``queue``: a 1-4 character string whose hash slot is the
    slot of the queue's keys (so ``dtq:task:{<tag>}:...`` lands next to them)."""
    return _slot_tags()[key_slot(queue)]


def new_task_id(queue: str) -> str:
    """A fresh task id for a task of ``queue``: 32 random hex characters, ``-``, and the
    queue's :func:`slot_tag`. Opaque to clients."""
    return f"{uuid.uuid4().hex}-{slot_tag(queue)}"


def idempotency_digest(key: str) -> str:
    """SHA-256 hex of a user idempotency key (so any bytes map to a safe name)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


#: First byte hashed before an internal deduplication key. 0xFF never occurs in UTF-8,
#: and a client's key is always UTF-8 (a protobuf string), so no client key hashes to
#: the digest of an internal one (short of a SHA-256 collision).
_INTERNAL_DOMAIN = b"\xff"


def internal_idempotency_digest(key: str) -> str:
    """Digest of a key dtq itself deduplicates with (``schedule:<name>:<fire ms>``,
    ``chain:<task id>``, ``group:<group id>``): 64 hex like :func:`idempotency_digest`,
    but of ``0xFF`` + the key's UTF-8, a byte string no client key can be. The record
    (:func:`idempotency`) therefore lives in a key space that a client's idempotency
    key, whatever its text, can never reach: a producer sending ``chain:<id>`` gets
    a record of its own and neither hijacks nor blocks the internal one."""
    return hashlib.sha256(_INTERNAL_DOMAIN + key.encode("utf-8")).hexdigest()
