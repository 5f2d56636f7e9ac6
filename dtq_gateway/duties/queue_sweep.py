"""The idle-queue sweep: deletes queues nothing has used for DTQ_QUEUE_IDLE_DELETE_S.

A queue name costs ten (empty) streams, their group and consumers, and a registry
entry for as long as it exists (docs/redis-layout.md, "Idle queues"). Runs on the
scheduler leader: it walks the registry ``dtq:queues`` by name, a few names per tick,
paced so that one pass over the registry takes about DTQ_QUEUE_IDLE_DELETE_S; skips
busy queues (``dtq:queues:busy``) and queues a live worker leases from (its record's
``queues``: a worker waiting on an empty queue never reads its streams); and runs
``delete_idle_queue.lua`` on the rest, which deletes a queue's ten streams only when
none holds an entry, none was written or read for the idle time, nothing is pending
and the queue is not paused. A queue is therefore deleted between one and two idle
times after its last use.

Steps and crashes: the script deletes the streams (one queue's keys, atomically),
then ``ZREM dtq:queues <queue>`` (a single-key command), then an EXISTS of the
queue's streams re-adds the name when a gateway created the queue again in between.
A crash after the script leaves a registry name without streams (ListQueues shows an
empty queue; the next pass removes it). A gateway whose cache still says the groups
exist recreates them when it next leases from the queue (NOGROUP recovery,
groups.py); nothing queued is lost, since the group starts at id 0.
"""

from __future__ import annotations

import logging
import math

from dtq_gateway import metrics
from dtq_gateway.duties.duty import PeriodicDuty
from dtq_gateway.duties.leader import LeaderLock
from dtq_gateway.settings import Settings
from dtq_gateway.store import idle_queues, reaping
from dtq_gateway.store.client import Client

log = logging.getLogger(__name__)

#: Most queues checked per tick.
MAX_PER_TICK = 200


class QueueSweep(PeriodicDuty):
    """Deletes idle queues (leader only); see the module docstring.

    Args:
        redis: client.
        settings: gateway settings (``queue_idle_delete_s``; 0 disables the sweep).
        lock: leadership.
    """

    name = "queue-sweep"

    def __init__(self, redis: Client, settings: Settings, lock: LeaderLock) -> None:
        super().__init__()
        self._redis = redis
        self._settings = settings
        self._lock = lock
        #: last registry name checked ("" = start of the registry)
        self._cursor = ""
        #: queues deleted since start
        self.deleted = 0
        #: batches of registry names checked since start
        self.batches = 0

    def interval_s(self) -> float:
        """A sixth of the idle time, within [0.25, 60] s."""
        return min(60.0, max(0.25, self._settings.queue_idle_delete_s / 6))

    def active(self) -> bool:
        """Only the scheduler leader sweeps, and only with a positive idle time."""
        return self._settings.queue_idle_delete_s > 0 and self._lock.is_leader

    async def tick(self) -> None:
        """Check the next few registry names."""
        await self.sweep_some()

    async def sweep_some(self) -> list[str]:
        """Check the next batch of registry names; returns the queues deleted, whose
        Prometheus series are removed (:func:`dtq_gateway.metrics.forget_queue`)."""
        self.batches += 1
        total = await idle_queues.registry_size(self._redis)
        if not total:
            return []
        per_tick = min(MAX_PER_TICK, max(1, math.ceil(
            total * self.interval_s() / self._settings.queue_idle_delete_s)))
        names = await reaping.registry_page(self._redis, self._cursor, per_tick)
        self._cursor = names[-1] if len(names) == per_tick else ""
        idle = await idle_queues.not_busy(self._redis, names)
        if idle:
            # a worker waiting on an empty queue leaves no trace in its streams (an idle
            # session only probes them with XLEN): its record says it listens
            listened = await idle_queues.listened_queues(self._redis)
            idle = [q for q in idle if q not in listened]
        if not idle:
            return []
        deleted = await idle_queues.delete_idle_queues(
            self._redis, idle, self._settings.queue_idle_delete_s * 1000)
        for queue in deleted:
            metrics.forget_queue(queue)
        if deleted:
            self.deleted += len(deleted)
            metrics.QUEUES_DELETED.inc(len(deleted))
            log.info("idle queues deleted", extra={"count": len(deleted)})
        return deleted
