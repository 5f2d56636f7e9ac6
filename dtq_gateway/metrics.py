"""Prometheus metrics of the gateway, each collector defined once, here.

Labels are bounded: ``queue`` (validated names), ``band`` (0..9), ``method``
(the fixed gRPC method paths) and ``code`` (gRPC status names). Task ids never
become labels. Counters and histograms are updated by the code paths that cause
them; the queue gauges are refreshed from Redis every ~5 s by
:class:`QueueGaugeCollector` (on every replica: gauges are set, not summed, so
any replica's scrape shows the cluster-wide Redis state).

Histograms are in seconds: lease wait = enqueue (or due time) to lease, run time
= lease to Ack/Fail.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc
from prometheus_client import Counter, Gauge, Histogram, start_http_server

from dtq_gateway.duties.duty import PeriodicDuty
from dtq_gateway.rpc.auth import WrappingInterceptor, wrap_handler
from dtq_gateway.store import admin, admin_lists, admin_waiting
from dtq_gateway.store.client import Client
from dtq_gateway.web.queue_rates import RATES

log = logging.getLogger(__name__)

_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900,
                 3600)
_RPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                10)

TASKS_ENQUEUED = Counter("dtq_tasks_enqueued_total", "Tasks accepted by Enqueue/EnqueueBatch "
                         "(deduplicated ones excluded).", ["queue"])
TASKS_SUCCEEDED = Counter("dtq_tasks_succeeded_total", "Tasks acked.", ["queue"])
TASKS_FAILED = Counter("dtq_tasks_failed_total", "Failed attempts (Fail, failure mode).",
                       ["queue"])
TASKS_RETRIED = Counter("dtq_tasks_retried_total", "Attempts scheduled or re-queued for retry.",
                        ["queue"])
TASKS_DEAD_LETTERED = Counter("dtq_tasks_dead_lettered_total",
                              "Tasks moved to the dead-letter stream.", ["queue"])
TASKS_EXPIRED = Counter("dtq_tasks_expired_total", "Tasks that expired before starting.",
                        ["queue"])
TASKS_CANCELLED = Counter("dtq_tasks_cancelled_total", "Tasks cancelled.", ["queue"])

LEASE_WAIT_SECONDS = Histogram("dtq_lease_wait_seconds",
                               "Time from enqueue (or due time) to lease (s).", ["queue"],
                               buckets=_WAIT_BUCKETS)
TASK_RUN_SECONDS = Histogram("dtq_task_run_seconds", "Time from lease to Ack/Fail (s).",
                             ["queue"], buckets=_WAIT_BUCKETS)
RPC_DURATION_SECONDS = Histogram("dtq_rpc_duration_seconds",
                                 "gRPC call duration by method and status code (s).",
                                 ["method", "code"], buckets=_RPC_BUCKETS)

QUEUE_DEPTH = Gauge("dtq_queue_depth", "Entries in a band stream (queued + leased).",
                    ["queue", "band"])
QUEUE_PENDING = Gauge("dtq_queue_pending", "Entries leased and not yet finished (PEL).",
                      ["queue", "band"])
QUEUE_BACKLOG_AGE_SECONDS = Gauge("dtq_queue_backlog_age_seconds",
                                  "Age of the oldest task waiting to be leased (s).", ["queue"])
#: A queue's waiting tasks are counted by type (dtq_queue_stuck_tasks) once its backlog
#: is this old (ms); at most STUCK_SCAN_MAX waiting entries (all bands) are read.
STUCK_CHECK_AGE_MS = 30_000
STUCK_SCAN_MAX = 1_000
QUEUE_STUCK_TASKS = Gauge(
    "dtq_queue_stuck_tasks", "Waiting tasks of types no live worker leasing from the queue "
    "takes (counted once the backlog is 30 s old; 0 before).", ["queue"])
WORKERS_LIVE = Gauge("dtq_workers_live", "Workers whose last heartbeat is younger than three "
                     "heartbeat intervals.")
EVENTS_DROPPED = Counter("dtq_events_dropped_total",
                         "Events dropped for Events.Subscribe clients (full buffer of a slow "
                         "client, or the gateway's delivery budget spent).")
EVENTS_SUBSCRIBERS = Gauge("dtq_events_subscribers", "Open Events.Subscribe streams on this "
                           "gateway replica.")
EVENTS_SUBSCRIPTIONS_REFUSED = Counter(
    "dtq_events_subscriptions_refused_total",
    "Events.Subscribe calls refused with RESOURCE_EXHAUSTED (DTQ_EVENTS_MAX_SUBSCRIBERS).")
METRICS_QUEUES_OMITTED = Gauge("dtq_metrics_queues_omitted",
                               "Busy queues left out of the per-queue gauges "
                               "(more than DTQ_METRICS_MAX_QUEUES).")
LIMIT_REFUSALS = Counter("dtq_limit_refusals_total", "Requests refused, or leases released, "
                         "because a configured bound was reached (limit: max_queues, "
                         "max_streams_per_peer, lease_buffer_max_bytes, events_max_subscribers).",
                         ["limit"])
QUEUES_DELETED = Counter("dtq_queues_deleted_total", "Idle queues deleted by the idle-queue "
                         "sweep (DTQ_QUEUE_IDLE_DELETE_S).")
LEASE_BUFFERED_BYTES = Gauge("dtq_lease_buffered_bytes", "Payload bytes delivered to Lease "
                             "streams of this replica and not yet written to them.")
RATE_LIMITED_READS = Counter("dtq_rate_limited_reads_total",
                             "Lease reads of a queue cut short by its queue-wide rate limit "
                             "(its tasks wait, queued, for tokens).", ["queue"])
RATE_LIMITED_TASKS = Counter("dtq_rate_limited_tasks_total",
                             "Entries of a throttled task type put back in their queue "
                             "(still queued, no attempt spent).", ["queue"])
SCHEDULE_FIRES = Counter("dtq_schedule_fires_total",
                         "Fires of periodic schedules enqueued (deduplicated ones, e.g. "
                         "enqueued before by a leader that died, excluded).")
SCHEDULE_FIRES_FAILED = Counter("dtq_schedule_fires_failed_total",
                                "Schedule fires not enqueued yet (queue full, Redis refused, "
                                "template refused): retried at the next tick.")
LEASE_SESSIONS = Gauge("dtq_lease_sessions", "Open Lease streams on this gateway replica.")
REDIS_EVICTION_SAFE = Gauge("dtq_redis_eviction_safe", "1 when Redis maxmemory-policy is "
                            "noeviction, 0 when Redis may evict dtq's keys, -1 when unknown.")
REDIS_MEMORY_FULL = Gauge("dtq_redis_memory_full", "1 while Redis used_memory has reached "
                          "maxmemory (writes are refused), else 0.")


def start_metrics_server(host: str, port: int) -> Any:
    """Serve ``/metrics`` over HTTP on ``host:port`` in a daemon thread.

    Returns:
        What prometheus-client returns (a ``(server, thread)`` pair); call
        ``server.shutdown()`` to stop it.
    """
    result = start_http_server(port, addr=host)
    log.info("metrics listening", extra={"host": host, "port": port})
    return result


class QueueGaugeCollector(PeriodicDuty):
    """Refreshes the queue and worker gauges from Redis about every ``interval_s``.

    Only busy queues (``dtq:queues:busy``) are read, so idle queues cost nothing,
    and at most ``max_queues`` of them get series: the deepest ones (one XLEN per
    band of every busy queue to rank them, then the full band read for those kept).
    ``dtq_metrics_queues_omitted`` counts the busy queues left out. A queue that
    leaves the busy set or the top ``max_queues`` loses its series.

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

    def interval_s(self) -> float:
        """Refresh period (s)."""
        return self._interval_s

    async def tick(self) -> None:
        """Read the deepest busy queues' bands and the workers, and set the gauges."""
        busy = await admin.busy_queues(self.redis)
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


_INT_CODES = {c.value[0]: c.name for c in grpc.StatusCode}


def _code_name(context: Any, exc: BaseException | None) -> str:
    """Status name of a finished call: the context's code, else from the outcome."""
    try:
        code = context.code()
    except Exception:  # noqa: BLE001 - test doubles without code()
        code = None
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(code, int):
        return _INT_CODES.get(code, "UNKNOWN")
    if exc is None:
        return "OK"
    return "CANCELLED" if isinstance(exc, asyncio.CancelledError) else "UNKNOWN"


_RPC_CHILDREN: dict[tuple[str, str], Any] = {}


def _rpc_child(method: str, code: str) -> Any:
    """The (method, code) child of the RPC histogram, cached: ``labels()`` per call
    costs a tuple, a lock and a dict lookup. Both labels are bounded."""
    child = _RPC_CHILDREN.get((method, code))
    if child is None:
        child = _RPC_CHILDREN[(method, code)] = RPC_DURATION_SECONDS.labels(
            method=method, code=code)
    return child


def _observed(method: str) -> Callable[[Callable[..., Any]], Any]:
    def make(behavior: Callable[..., Any]) -> Any:
        if inspect.isasyncgenfunction(behavior):
            async def run_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                start, exc = time.perf_counter(), None
                try:
                    async for item in behavior(request, context):
                        yield item
                except BaseException as e:
                    exc = e
                    raise
                finally:
                    _rpc_child(method, _code_name(context, exc)).observe(
                        time.perf_counter() - start)

            return run_stream

        async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
            start, exc = time.perf_counter(), None
            try:
                result = behavior(request, context)
                return await result if inspect.isawaitable(result) else result
            except BaseException as e:
                exc = e
                raise
            finally:
                _rpc_child(method, _code_name(context, exc)).observe(time.perf_counter() - start)

        return run

    return make


class MetricsInterceptor(WrappingInterceptor):
    """Observes ``dtq_rpc_duration_seconds{method, code}`` for every known method.

    Put it first in the interceptor list so calls refused by authentication are
    measured too. Unknown methods (UNIMPLEMENTED) are not observed, which keeps
    the ``method`` label bounded.
    """

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """The method's handler with a timer."""
        return wrap_handler(handler, _observed(method))
