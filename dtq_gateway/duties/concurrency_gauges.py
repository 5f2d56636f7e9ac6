"""The per-key concurrency gauges (``dtq_concurrency_*``), refreshed with the queue
gauges (:class:`dtq_gateway.duties.queue_gauges.QueueGaugeCollector`)."""

from __future__ import annotations

from prometheus_client import Gauge

from dtq_gateway.metrics import (
    CONCURRENCY_ACTIVE,
    CONCURRENCY_KEYS,
    CONCURRENCY_TOP_KEYS,
    CONCURRENCY_WAITING,
    CONCURRENCY_WAITING_TOTAL,
)
from dtq_gateway.store import concurrency
from dtq_gateway.store.client import Client


class ConcurrencyGauges:
    """Sets the gauges of the busiest keys of each exported queue; a key that leaves a
    queue's top :data:`CONCURRENCY_TOP_KEYS` (or a queue that leaves the export) loses
    its series, so the series count stays bounded however many keys ever existed."""

    def __init__(self) -> None:
        self._shown: set[tuple[str, str]] = set()
        self._queues: set[str] = set()

    async def refresh(self, redis: Client, queues: list[str]) -> None:
        """Read the queues' active and parked counts per key (one pipeline) and set the
        gauges. Queues without keys in use get no series."""
        shown: set[tuple[str, str]] = set()
        used: set[str] = set()
        for c in await concurrency.get_many(redis, queues, CONCURRENCY_TOP_KEYS):
            if not c.key_count:
                continue
            used.add(c.queue)
            CONCURRENCY_KEYS.labels(queue=c.queue).set(c.key_count)
            CONCURRENCY_WAITING_TOTAL.labels(queue=c.queue).set(c.waiting)
            for k in c.keys:
                shown.add((c.queue, k.key))
                CONCURRENCY_ACTIVE.labels(queue=c.queue, key=k.key).set(k.active)
                CONCURRENCY_WAITING.labels(queue=c.queue, key=k.key).set(k.waiting)
        for labels in self._shown - shown:
            _remove(CONCURRENCY_ACTIVE, *labels)
            _remove(CONCURRENCY_WAITING, *labels)
        for queue in self._queues - used:
            _remove(CONCURRENCY_KEYS, queue)
            _remove(CONCURRENCY_WAITING_TOTAL, queue)
        self._shown, self._queues = shown, used


def _remove(gauge: Gauge, *labels: str) -> None:
    try:
        gauge.remove(*labels)
    except KeyError:
        pass
