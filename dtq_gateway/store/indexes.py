"""Writers of the keys that span queues: the recent-tasks index and the busy-queue set.

Each is written with single-key commands after the per-queue script that made the
change (a script touches the keys of one queue, i.e. one hash slot). The order makes a
crash between the two steps harmless or repaired:

- ``dtq:tasks:recent`` (ListTasks' index): ZADD after the enqueue; a crash in between
  leaves a task out of the listing (GetTask still finds it).
- ``dtq:queues:busy``: SADD after a script reported that it set the queue's busy marker
  (``dtq:queue:{q}:busy``). A crash in between leaves a busy queue out of the set until
  the scheduler leader's registry sweep (duties/reaper.py) finds its marker and adds it.
  The same step ZADDs (NX) such a queue to the registry ``dtq:queues``, where it is
  missing only when the queue was deleted while this replica's cache said it existed.

The SADDs of the busy set and of the dead-letter index go through ``index_add.lua``
(:func:`queue_set_add`, :func:`set_add`), which may write while Redis's memory is full:
the reaper and the mover find queues through these sets, so the way out of a full
Redis (docs/operations.md) needs them. The recent-tasks index and the registry ZADD are
plain commands, refused then (logged; a listing aid and a rare repair).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from redis.exceptions import RedisError

from dtq_gateway.logconf import RateLimitedLog
from dtq_gateway.store import keys
from dtq_gateway.store.errors import is_redis_outage
from dtq_gateway.store.scripts import Script, ScriptPipeline, execute

_log = RateLimitedLog(logging.getLogger(__name__))

INDEX_ADD = Script("index_add", allow_oom=True)


def queue_set_add(pipe: Any, key: str, members: Iterable[str]) -> None:
    """Queue an SADD of ``members`` (not empty) to the index set ``key`` on ``pipe`` (a
    pipeline run by :func:`dtq_gateway.store.scripts.execute`): index_add.lua, which
    may write while Redis's memory is full."""
    INDEX_ADD.queue(pipe, [key], Script.argv(*members))


async def set_add(client: Any, key: str, members: Iterable[str]) -> None:
    """SADD ``members`` (not empty) to the index set ``key`` (index_add.lua, one round
    trip; may write while Redis's memory is full).

    Raises:
        Any Redis error.
    """
    await INDEX_ADD(client, [key], Script.argv(*members))


def queue_index_writes(pipe: Any, recent: Sequence[Any], busy: Iterable[str],
                       recent_max: int) -> bool:
    """Queue the index writes on ``pipe``: ZADD of ``recent`` ({ms, id, ms, id, ...},
    as enqueue.lua returns them) to the recent-tasks index, trimmed to its newest
    ``recent_max`` members, and SADD of the ``busy`` queues. Returns False when there
    was nothing to write."""
    wrote = False
    if recent:
        pipe.zadd(keys.RECENT_TASKS, {recent[i + 1]: int(recent[i])
                                      for i in range(0, len(recent), 2)})
        pipe.zremrangebyrank(keys.RECENT_TASKS, 0, -(recent_max + 1))
        wrote = True
    busy = sorted(set(busy))
    if busy:
        queue_set_add(pipe, keys.BUSY_QUEUES, busy)
        # a queue that became busy is listed again if it had been deleted meanwhile
        # (DeleteQueue or the idle sweep on another replica, whose deletion this
        # replica's group cache missed): ZADD NX leaves a listed name as it is
        pipe.zadd(keys.QUEUES, dict.fromkeys(busy, 0), nx=True)
        wrote = True
    return wrote


async def write_indexes(client: Any, recent: Sequence[Any], busy: Iterable[str],
                        recent_max: int) -> None:
    """Run :func:`queue_index_writes` in one pipeline (one round trip per node)."""
    pipe = ScriptPipeline(client)
    if queue_index_writes(pipe, recent, busy, recent_max):
        for reply in await execute(client, pipe):  # every write runs, then the first error
            if isinstance(reply, Exception):
                raise reply


async def write_indexes_logged(client: Any, recent: Sequence[Any], busy: Iterable[str],
                               recent_max: int) -> None:
    """:func:`write_indexes` for callers whose own change already happened (an enqueue
    the client must hear about): a Redis error is logged (rate-limited), not raised,
    because the indexes are repaired (busy set) or only a listing aid (recent tasks)."""
    try:
        await write_indexes(client, recent, busy, recent_max)
    except Exception as exc:
        if not (isinstance(exc, RedisError) or is_redis_outage(exc)):
            raise
        _log.log(logging.WARNING, "index write after an enqueue failed: %s",
                 type(exc).__name__, busy_queues=sorted(set(busy)))


async def mark_busy(client: Any, queues: Iterable[str]) -> None:
    """SADD ``queues`` to the busy set (after a script set their busy markers)."""
    queues = sorted(set(queues))
    if queues:
        await set_add(client, keys.BUSY_QUEUES, queues)
