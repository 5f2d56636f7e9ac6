"""Seed and snapshot helpers for lease-path tests on a private Redis.

``seed_queue`` enqueues tasks through the broker (the front door), ``read_by_hand``
takes entries off a band stream the way a read that was not activated yet leaves them
(XREADGROUP only), and ``snapshot_queue`` reads a queue's streams, PEL and task records
back as one comparable value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dtq_gateway.domain.validation import validate_enqueue
from dtq_gateway.store import keys
from dtq_gateway.store.lease_replies import LeaseRead, ReadEntry, WorkerState
from dtq_gateway.store.ratelimits import Limits
from dtq_gateway.store.replies import text
from dtq_proto import dtq_pb2 as pb


async def seed_queue(broker: Any, settings: Any, queue: str = "q", count: int = 1,
                     **fields: Any) -> list[str]:
    """Enqueue ``count`` tasks into ``queue`` through ``broker`` (a store Broker);
    ``fields`` are EnqueueRequest fields (task_type defaults to "t"). Returns the ids."""
    fields.setdefault("task_type", "t")
    reqs = [validate_enqueue(pb.EnqueueRequest(queue=queue, **fields), settings)
            for _ in range(count)]
    return [out.task_id for out in await broker.enqueue_many(reqs)]


async def read_by_hand(redis: Any, worker_id: str, queue: str, band: int,
                       count: int = 10) -> LeaseRead:
    """XREADGROUP up to ``count`` new entries of one band for ``worker_id`` and return
    them as a read whose entries are not activated yet (the two-step path's input)."""
    stream = keys.stream(queue, band)
    got = await redis.xreadgroup(keys.GROUP, worker_id, {stream: ">"}, count=count)
    entries = [ReadEntry(stream, queue, band, text(entry_id),
                         {text(k): v for k, v in raw.items()})
               for _, items in got for entry_id, raw in items]
    return LeaseRead(0, [], WorkerState.OK, 1, Limits(0, set(), set(), set()), entries)


@dataclass(frozen=True)
class QueueSnapshot:
    """What Redis holds for one queue: per band, the entry ids in its stream and the
    (entry id, consumer) pairs of its PEL; per task id, its record's status."""

    streams: dict[int, list[str]]
    pel: dict[int, list[tuple[str, str]]]
    tasks: dict[str, str]


async def snapshot_queue(redis: Any, queue: str) -> QueueSnapshot:
    """A :class:`QueueSnapshot` of ``queue`` (bands without entries left out)."""
    streams: dict[int, list[str]] = {}
    pel: dict[int, list[tuple[str, str]]] = {}
    tasks: dict[str, str] = {}
    for band in keys.BANDS_DESC:
        stream = keys.stream(queue, band)
        entries = await redis.xrange(stream)
        if entries:
            streams[band] = [text(i) for i, _ in entries]
            for _, f in entries:
                task_id = text(f[b"task_id"])
                tasks[task_id] = text(await redis.hget(keys.task(task_id), "status"))
        if await redis.exists(stream):
            rows = await redis.xpending_range(stream, keys.GROUP, "-", "+", 1000)
            if rows:
                pel[band] = [(text(r["message_id"]), text(r["consumer"])) for r in rows]
    return QueueSnapshot(streams, pel, tasks)
