"""Per-key concurrency: at most N active tasks per concurrency key of a queue.

A task may carry a concurrency key (``EnqueueRequest.concurrency_key``, record field
``ckey``). The rule of a queue is one number, ``max_active_per_key``, stored in
``dtq:conc:{<queue>}:limit`` and shared by every gateway. The accounting is done by
the scripts that start and end leases (``lua/_concurrency.lua``): the active tasks per
key are one hash per queue, a task whose key is at its limit is parked (out of its
band stream, still queued) and every lease end of the key moves one parked task back
to the tail of its band (docs/fairness.md). This module is the Admin side: set,
read, delete and list the limits. The registry ``dtq:conc:limits`` (queue names with a
limit) is touched with single-key commands only: it is added to before the limit is
written and removed from after the limit is deleted, so a listing skips a member whose
limit is gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dtq_gateway.domain.validation import check_queue
from dtq_gateway.errors import InvalidArgument
from dtq_gateway.store import keys
from dtq_gateway.store.client import Client
from dtq_gateway.store.replies import text
from dtq_gateway.store.scripts import Script

CONCURRENCY_SET = Script("concurrency_set", helpers=("_finished", "_concurrency"))
MAX_PER_KEY = 1_000_000
#: Most parked tasks one concurrency_set call moves back to their bands.
MOVE_BUDGET = 1000
DEFAULT_KEYS = 100
MAX_KEYS = 1000


@dataclass(frozen=True, slots=True)
class KeyStats:
    """One concurrency key now: ``active`` tasks running, ``waiting`` parked."""

    key: str
    active: int
    waiting: int


@dataclass(frozen=True, slots=True)
class QueueConcurrency:
    """A queue's limit (0 = none), its busiest keys, how many keys are in use and the
    active and waiting (parked) tasks of all its keys."""

    queue: str
    max_active_per_key: int
    keys: list[KeyStats]
    key_count: int
    active: int
    waiting: int


@dataclass(frozen=True, slots=True)
class ConcurrencySetReply:
    """concurrency_set.lua's reply, decoded (:meth:`of`).

    Attributes:
        previous: the queue's per-key limit before the call (0 = none).
        moved: parked tasks this call moved back to their bands.
        more: more parked tasks may be free to move (call again).
    """

    previous: int
    moved: int
    more: bool

    @classmethod
    def of(cls, reply: list[Any]) -> ConcurrencySetReply:
        """Decode ``{previous limit, tasks moved, 1 = more else 0}``."""
        return cls(int(reply[0]), int(reply[1]), bool(int(reply[2])))


def validate(queue: str, max_active_per_key: int) -> tuple[str, int]:
    """Check a SetConcurrencyLimit request.

    Returns:
        (queue, max_active_per_key).

    Raises:
        InvalidArgument: naming ``queue`` or ``max_active_per_key`` (1..1,000,000).
    """
    check_queue(queue)
    if not 1 <= max_active_per_key <= MAX_PER_KEY:
        raise InvalidArgument(f"max_active_per_key: must be 1..{MAX_PER_KEY}",
                              field="max_active_per_key")
    return queue, max_active_per_key


async def _apply(redis: Client, queue: str, limit: str) -> int:
    """Run concurrency_set.lua until it has moved every parked task the new rule lets
    go (``MOVE_BUDGET`` per call). Returns the limit before the change (0 = none)."""
    keys_ = [keys.concurrency_limit(queue), keys.concurrency_active(queue),
             keys.concurrency_waiting(queue)]
    previous: int | None = None
    more = True
    while more:
        reply = ConcurrencySetReply.of(
            await CONCURRENCY_SET(redis, keys_, Script.argv(queue, limit, MOVE_BUDGET)))
        if previous is None:
            previous = reply.previous
        limit, more = "", reply.more  # later calls only move what is still free
    return previous or 0


async def set_limit(redis: Client, queue: str, max_active_per_key: int) -> bool:
    """Set or change the per-key limit of ``queue`` (validated by :func:`validate`);
    parked tasks the new limit has room for go back to their bands at once.

    Returns:
        True when the queue had no limit before.
    """
    await redis.sadd(keys.CONCURRENCY_LIMITED_QUEUES, queue)
    return await _apply(redis, queue, str(max_active_per_key)) == 0


async def delete_limit(redis: Client, queue: str) -> bool:
    """Remove the per-key limit of ``queue``; every parked task goes back to its band.

    Returns:
        False when the queue had no limit.

    Raises:
        InvalidArgument: a malformed queue name.
    """
    check_queue(queue)
    previous = await _apply(redis, queue, "0")
    await redis.srem(keys.CONCURRENCY_LIMITED_QUEUES, queue)
    return previous > 0


async def get(redis: Client, queue: str, max_keys: int = DEFAULT_KEYS) -> QueueConcurrency:
    """A queue's limit and its busiest keys (most active plus waiting first, ties by
    key), reading the whole active and waiting hashes (one field per key in use).

    Raises:
        InvalidArgument: a malformed queue name or ``max_keys`` outside 0..1000.
    """
    check_queue(queue)
    if not 0 <= max_keys <= MAX_KEYS:
        raise InvalidArgument(f"max_keys: must be 0..{MAX_KEYS}", field="max_keys")
    (got,) = await get_many(redis, [queue], max_keys or DEFAULT_KEYS)
    return got


async def get_many(redis: Client, queues: list[str], max_keys: int) -> list[QueueConcurrency]:
    """:func:`get` for several queues in one pipeline (queues not validated), in order."""
    async with redis.pipeline(transaction=False) as pipe:
        for queue in queues:
            pipe.get(keys.concurrency_limit(queue))
            pipe.hgetall(keys.concurrency_active(queue))
            pipe.hgetall(keys.concurrency_waiting(queue))
        replies = await pipe.execute()
    out = []
    for i, queue in enumerate(queues):
        limit, active, waiting = replies[3 * i:3 * i + 3]
        counts: dict[str, list[int]] = {}
        for j, table in enumerate((active, waiting)):
            for k, v in table.items():
                counts.setdefault(text(k), [0, 0])[j] = max(0, int(v))
        ranked = sorted(counts.items(), key=lambda kv: (-(kv[1][0] + kv[1][1]), kv[0]))
        out.append(QueueConcurrency(
            queue, int(limit or 0), [KeyStats(k, a, w) for k, (a, w) in ranked[:max_keys]],
            len(counts), sum(a for a, _ in counts.values()),
            sum(w for _, w in counts.values())))
    return out


async def list_limits(redis: Client) -> list[tuple[str, int]]:
    """Every queue's per-key limit as (queue, max_active_per_key), sorted by queue."""
    queues = sorted(text(q) for q in await redis.smembers(keys.CONCURRENCY_LIMITED_QUEUES))
    if not queues:
        return []
    async with redis.pipeline(transaction=False) as pipe:  # one slot per queue
        for q in queues:
            pipe.get(keys.concurrency_limit(q))
        values = await pipe.execute()
    return [(q, int(v)) for q, v in zip(queues, values) if v]
