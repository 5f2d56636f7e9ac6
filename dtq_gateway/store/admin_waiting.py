"""Admin: a queue's waiting tasks by type and its outcome counters (GetQueueStats).

The waiting tasks are counted by ``queue_waiting.lua`` (a bounded read of the
entries no session has read yet); a type is *taken* when a live worker whose latest
Lease session named the queue takes it. The outcome counters are the hash
``dtq:queue:{<q>}:counters`` that ack.lua, fail.lua and reclaim.lua increment (and
the cancel scripts, cancelled: docs/redis-layout.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
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
    #: some live worker leasing from the queue takes this type (and has the labels)
    taken: bool
    #: the labels these tasks require (EnqueueRequest.required_labels; docs/fairness.md)
    required_labels: dict[str, str] = field(default_factory=dict)


def _labels(raw: object) -> dict[str, str]:
    """A required-labels JSON object ({} when empty or not an object of strings)."""
    try:
        value = json.loads(text(raw) or "{}")
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items()}


@dataclass(frozen=True, slots=True)
class WaitingRow:
    """One task type's (and required labels') waiting entries in a queue_waiting.lua
    reply: how many, and the oldest wait start (epoch ms)."""

    task_type: str
    waiting: int
    since_ms: int
    required_labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WaitingReply:
    """queue_waiting.lua's reply, decoded (:meth:`of`).

    Attributes:
        read: entries the script read (at most its scan bound).
        complete: every waiting entry was read.
        rows: per task type and required labels, in the script's order.
    """

    read: int
    complete: bool
    rows: tuple[WaitingRow, ...] = ()

    @classmethod
    def of(cls, reply: list[Any]) -> WaitingReply:
        """Decode ``{read, complete, {task_type, waiting, since_ms[, labels JSON]}...}``."""
        rows = tuple(WaitingRow(text(name), int(n), int(since),
                                _labels(rest[0] if rest else b""))
                     for name, n, since, *rest in reply[2:])
        return cls(int(reply[0]), bool(int(reply[1])), rows)


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
    reply = WaitingReply.of(await QUEUE_WAITING(redis, *waiting_call(queue, scan_max)))
    workers = await list_workers(redis, heartbeat_interval_ms) if reply.rows else []
    return waiting_types(reply, queue, now_ms, workers)


def waiting_types(reply: WaitingReply, queue: str, now_ms: int, workers: list[WorkerRecord]
                  ) -> tuple[list[TypeWaiting], bool]:
    """:func:`waiting_by_type` of a decoded ``queue_waiting.lua`` reply and the known
    workers."""
    takers = [w for w in workers
              if w.alive and w.status != "stopped" and queue in w.queues]
    out = []
    for row in reply.rows:
        need = row.required_labels
        out.append(TypeWaiting(
            task_type=row.task_type, waiting=row.waiting,
            oldest_age_ms=max(0, now_ms - row.since_ms),
            taken=any((not w.task_types or row.task_type in w.task_types)
                      and all(w.labels.get(k) == v for k, v in need.items())
                      for w in takers),
            required_labels=need))
    out.sort(key=lambda t: (-t.waiting, t.task_type))
    return out, reply.complete
