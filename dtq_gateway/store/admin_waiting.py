"""Admin: a queue's waiting tasks by type and its outcome counters (GetQueueStats).

The waiting tasks are counted by ``queue_waiting.lua`` (a bounded read of the
entries no session has read yet); a type is *taken* when a live worker whose latest
Lease session named the queue takes it. The outcome counters are the hash
``dtq:queue:{<q>}:counters`` that ack.lua and fail.lua increment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dtq_gateway.store import keys
from dtq_gateway.store.admin_lists import WorkerRecord, list_workers
from dtq_gateway.store.admin_scripts import QUEUE_WAITING
from dtq_gateway.store.client import Client
from dtq_gateway.store.replies import text

#: Most waiting entries (all bands together, p9 first) GetQueueStats reads to count
#: waiting tasks by type.
WAITING_SCAN_MAX = 2000
#: Fields of dtq:queue:{<q>}:counters.
COUNTER_FIELDS = ("succeeded", "retried", "dead_lettered", "cancelled")


@dataclass(frozen=True, slots=True)
class TypeWaiting:
    """Waiting tasks of one type in a queue (GetQueueStats.waiting_types)."""

    task_type: str
    waiting: int
    oldest_age_ms: int
    #: some live worker leasing from the queue takes this type
    taken: bool


def _int(value: object) -> int:
    try:
        return int(text(value) or 0)
    except ValueError:
        return 0


async def queue_counters(redis: Client, queue: str) -> dict[str, int]:
    """The queue's outcome counters (``dtq:queue:{<q>}:counters``; absent fields are 0;
    the history sampler's baselines ``h_*`` are left out)."""
    return counters_of(await redis.hgetall(keys.queue_counters(queue)))


def counters_of(raw: Any) -> dict[str, int]:
    """:func:`queue_counters` of an HGETALL reply of the counters hash."""
    out = dict.fromkeys(COUNTER_FIELDS, 0)
    out.update({k: _int(v) for k, v in ((text(k), v) for k, v in raw.items())
                if k in out})
    return out


def waiting_call(queue: str, scan_max: int = WAITING_SCAN_MAX) -> tuple[list[str], list[Any]]:
    """(KEYS, ARGV) of the ``queue_waiting.lua`` call :func:`waiting_by_type` makes."""
    return keys.queue_streams_desc(queue), QUEUE_WAITING.argv(keys.GROUP, scan_max)


async def waiting_by_type(redis: Client, queue: str, now_ms: int, heartbeat_interval_ms: int,
                          scan_max: int = WAITING_SCAN_MAX) -> tuple[list[TypeWaiting], bool]:
    """Waiting tasks of ``queue`` by type, most waiting first, and whether every waiting
    entry was read (at most ``scan_max`` entries in all, p9 first, by
    ``queue_waiting.lua``).

    A type is ``taken`` when a live worker whose latest Lease session named this
    queue takes it (an empty task type filter takes every type).
    """
    reply = await QUEUE_WAITING(redis, *waiting_call(queue, scan_max))
    workers = await list_workers(redis, heartbeat_interval_ms) if reply[2:] else []
    return waiting_types(reply, queue, now_ms, workers)


def waiting_types(reply: Any, queue: str, now_ms: int, workers: list[WorkerRecord]
                  ) -> tuple[list[TypeWaiting], bool]:
    """:func:`waiting_by_type` of a ``queue_waiting.lua`` reply and the known workers."""
    rows = reply[2:]
    takers = [w for w in workers
              if w.alive and w.status != "stopped" and queue in w.queues]
    takes_all = any(not w.task_types for w in takers)
    taken = {t for w in takers for t in w.task_types}
    out = [TypeWaiting(task_type=text(name), waiting=int(n),
                       oldest_age_ms=max(0, now_ms - int(since)),
                       taken=takes_all or text(name) in taken)
           for name, n, since in rows]
    out.sort(key=lambda t: (-t.waiting, t.task_type))
    return out, bool(int(reply[1]))
