"""The queue and worker gauges of :mod:`dtq_gateway.metrics`, refreshed from Redis."""

from __future__ import annotations

from prometheus_client import Gauge

from dtq_gateway import metrics
from dtq_gateway.duties.concurrency_gauges import ConcurrencyGauges
from dtq_gateway.duties.duty import PeriodicDuty
from dtq_gateway.metrics import (
    METRICS_QUEUES_OMITTED,
    QUEUE_BACKLOG_AGE_SECONDS,
    QUEUE_DEPTH,
    QUEUE_PENDING,
    QUEUE_STUCK_TASKS,
    REDIS_CPU_SECONDS,
    REDIS_MAXMEMORY_BYTES,
    REDIS_UP,
    REDIS_USED_MEMORY_BYTES,
    STUCK_CHECK_AGE_MS,
    STUCK_SCAN_MAX,
    WORKERS_LIVE,
)
from dtq_gateway.queue_rates import RATES
from dtq_gateway.store import admin, admin_lists, admin_waiting
from dtq_gateway.store import health as redis_health
from dtq_gateway.store.client import Client
from dtq_gateway.store.errors import is_redis_outage


class QueueGaugeCollector(PeriodicDuty):
    """Refreshes the queue and worker gauges from Redis about every ``interval_s``.

    Only busy queues (``dtq:queues:busy``) are read, so idle queues cost nothing,
    and at most ``max_queues`` of them get series: the deepest ones (one XLEN per
    band of every busy queue to rank them, then the full band read for those kept).
    ``dtq_metrics_queues_omitted`` counts the busy queues left out. A queue that
    leaves the busy set or the top ``max_queues`` loses its series. The same queues
    get the per-key concurrency gauges (:class:`ConcurrencyGauges`).

    Every tick it first reads Redis's INFO memory and cpu (``dtq_redis_up``,
    ``dtq_redis_used_memory_bytes``, ``dtq_redis_maxmemory_bytes``,
    ``dtq_redis_cpu_seconds``); when Redis cannot be reached ``dtq_redis_up`` drops to 0.

    It also forgets deleted queues (:func:`dtq_gateway.metrics.forget_queue`): every
    tick, the queues this replica has counted (outcome counters, histograms) that are
    not busy are looked up in the registry (ZMSCORE), and those it no longer holds
    lose all their series. That covers deletions this replica did not make itself:
    the idle-queue sweep of the scheduler leader on another replica, an operator.

    Run with ``task = asyncio.create_task(collector.run())``; end with
    ``collector.stop(); await task``.

    Args:
        redis: the gateway's client.
        heartbeat_interval_ms: worker heartbeat interval (liveness = 3 intervals).
        interval_s: refresh period before ±20 % jitter (s).
        max_queues: most queues exported (DTQ_METRICS_MAX_QUEUES).
    """

    name = "metrics-refresh"

    def __init__(self, redis: Client, heartbeat_interval_ms: int,
                 interval_s: float = 5.0, max_queues: int = 200) -> None:
        super().__init__()
        self.redis = redis
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.max_queues = max_queues
        self._interval_s = interval_s
        self._queues: set[str] = set()
        self._concurrency = ConcurrencyGauges()

    def interval_s(self) -> float:
        """Refresh period (s)."""
        return self._interval_s

    async def tick(self) -> None:
        """Read Redis's memory and CPU, the deepest busy queues' bands and the workers,
        and set the gauges (``dtq_redis_up`` 0 when Redis could not be reached)."""
        await self._read_redis()
        busy = await admin.busy_queues(self.redis)
        await self._forget_deleted(set(busy))
        depths = await admin.queue_depths(self.redis, busy)
        shown = sorted(busy, key=lambda q: (-depths[q], q))[:self.max_queues]
        METRICS_QUEUES_OMITTED.set(len(busy) - len(shown))
        now = await admin.redis_now_ms(self.redis)
        for queue, bands in (await admin.band_infos_many(self.redis, shown)).items():
            for b in bands:
                QUEUE_DEPTH.labels(queue=queue, band=str(b.band)).set(b.depth)
                QUEUE_PENDING.labels(queue=queue, band=str(b.band)).set(b.pending)
            oldest = [b.oldest_undelivered_ms for b in bands if b.oldest_undelivered_ms]
            age_ms = max(0, now - min(oldest)) if oldest else 0
            QUEUE_BACKLOG_AGE_SECONDS.labels(queue=queue).set(age_ms / 1000.0)
            stuck = 0
            if age_ms >= STUCK_CHECK_AGE_MS:
                waiting, _ = await admin_waiting.waiting_by_type(
                    self.redis, queue, now, self.heartbeat_interval_ms, STUCK_SCAN_MAX)
                stuck = sum(t.waiting for t in waiting if not t.taken)
            QUEUE_STUCK_TASKS.labels(queue=queue).set(stuck)
        await self._read_counters(shown, now)
        await self._concurrency.refresh(self.redis, shown)
        names = set(shown)
        for gone in self._queues - names:
            for band in range(10):
                for gauge in (QUEUE_DEPTH, QUEUE_PENDING):
                    _remove(gauge, gone, str(band))
            _remove(QUEUE_BACKLOG_AGE_SECONDS, gone)
            _remove(QUEUE_STUCK_TASKS, gone)
        self._queues = names
        workers = await admin_lists.list_workers(self.redis, self.heartbeat_interval_ms)
        WORKERS_LIVE.set(sum(1 for w in workers if w.alive))

    async def _read_redis(self) -> None:
        """Set the Redis gauges (memory, CPU, reachability).

        Raises:
            The Redis outage error (after setting ``dtq_redis_up`` to 0).
        """
        try:
            memory = await redis_health.read_memory(self.redis)
            cpu_s = await redis_health.read_cpu_seconds(self.redis)
        except Exception as exc:
            if is_redis_outage(exc):
                REDIS_UP.set(0)
                raise
            # a server that refuses INFO (renamed on some managed services) still
            # answered: the queue gauges are refreshed without the Redis ones
            REDIS_UP.set(1)
            return
        REDIS_UP.set(1)
        REDIS_USED_MEMORY_BYTES.set(memory.used_bytes)
        REDIS_MAXMEMORY_BYTES.set(memory.max_bytes)
        REDIS_CPU_SECONDS.set(cpu_s)

    async def _forget_deleted(self, busy: set[str]) -> None:
        """Remove the series of counted queues that are neither busy nor registered."""
        idle = sorted(metrics.counted_queues() - busy)
        for queue in await admin.unregistered(self.redis, idle):
            metrics.forget_queue(queue)

    async def _read_counters(self, queues: list[str], now_ms: int) -> None:
        """Read the queues' outcome counters so GetQueueStats has an earlier reading
        to compute throughput from (queue_rates)."""
        if not queues:
            return
        rows = await admin.outcome_counts_many(self.redis, queues)
        for queue, (ok, retried, dead) in zip(queues, rows):
            RATES.observe(queue, now_ms, ok, retried + dead)


def _remove(gauge: Gauge, *labels: str) -> None:
    try:
        gauge.remove(*labels)
    except KeyError:
        pass
