"""Prometheus metrics of the gateway, each collector defined once, here.

Labels are bounded: ``queue`` (validated names), ``band`` (0..9), ``method``
(the fixed gRPC method paths) and ``code`` (gRPC status names). Task ids never
become labels. Counters and histograms are updated by the code paths that cause
them; the queue gauges are refreshed from Redis every ~5 s by
:class:`dtq_gateway.duties.queue_gauges.QueueGaugeCollector` (on every replica: gauges are set, not summed, so
any replica's scrape shows the cluster-wide Redis state).

Every RPC's duration is observed by
:class:`dtq_gateway.rpc.metrics_interceptor.MetricsInterceptor`.

Histograms are in seconds: lease wait = enqueue (or due time) to lease, run time
= lease to Ack/Fail.

A deleted queue's series are removed from every per-queue collector by
:func:`forget_queue`, so ``/metrics`` does not grow with queue churn: the idle-queue
sweep calls it for the queues it deletes, and the gauge refresher for queues that
left the registry otherwise (another replica's sweep, an operator).
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics, start_http_server

log = logging.getLogger(__name__)

# No `*_created` series beside each counter and histogram (a timestamp per labelled child
# that doubles the series count and that Prometheus ignores): docs/operations.md, Metrics.
disable_created_metrics()

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
                         "max_schedules, max_rate_limits, max_streams_per_peer, "
                         "lease_buffer_max_bytes, events_max_subscribers).",
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
PROGRESS_DROPPED = Counter(
    "dtq_progress_reports_dropped_total",
    "Progress reports not applied (reason: rate = over the per-lease bound of 2 reports "
    "per second; unlisted = a second report for one lease in a heartbeat, or a report for "
    "a lease the heartbeat does not list).", ["reason"])
DASHBOARD_MALFORMED_REQUESTS = Counter(
    "dtq_dashboard_malformed_requests_total",
    "HTTP requests to the dashboard port that could not be parsed (answered 400, logged at "
    "DEBUG).")
SCHEDULE_FIRES_LATE = Counter(
    "dtq_schedule_fires_late_total",
    "Schedule fires enqueued more than 1 s after their fire time (a busy or failed-over "
    "leader, a fire retried after a failure).")
SCHEDULE_FIRES_MISSED = Counter(
    "dtq_schedule_fires_missed_total",
    "Schedule fires the missed-fire policy dropped (older than 30 s and not caught up), "
    "by policy (skip, latest, all).", ["policy"])
LEASE_STREAMS_NOT_READING = Counter(
    "dtq_lease_streams_not_reading_total", "Lease streams ended because they stopped "
    "reading: no receipt (heartbeat, Ack or Fail naming a lease written to them) for two "
    "heartbeat intervals, at most half the visibility timeout.")
LEASES_RELEASED_UNREAD = Counter(
    "dtq_leases_released_unread_total", "Leases written to a Lease stream that stopped "
    "reading and put back in their queue unread, without spending an attempt.")
BACKGROUND_TASK_RESTARTS = Counter(
    "dtq_background_task_restarts_total", "Background tasks of this gateway replica "
    "restarted by its supervisor after they ended while it served (task: health, "
    "events-hub, metrics-refresh, dispatcher, scheduler, primary-watch).", ["task"])
LEASE_SESSIONS = Gauge("dtq_lease_sessions", "Open Lease streams on this gateway replica.")
REDIS_EVICTION_SAFE = Gauge("dtq_redis_eviction_safe", "1 when Redis maxmemory-policy is "
                            "noeviction, 0 when Redis may evict dtq's keys, -1 when unknown.")
SCHEDULER_LEADER = Gauge("dtq_scheduler_leader", "1 while this gateway replica holds the "
                         "scheduler lock (it moves due tasks, reaps leases), else 0.")
REDIS_MEMORY_FULL = Gauge("dtq_redis_memory_full", "1 while Redis used_memory has reached "
                          "maxmemory (Enqueue is refused; leasing, Ack and Fail drain it on "
                          "Redis 7.0+), else 0.")
#: Read by the metrics refresh (duties/queue_gauges.py) every DTQ metrics interval (5 s).
REDIS_UP = Gauge("dtq_redis_up", "1 when this replica's last metrics refresh reached Redis "
                 "(every primary in cluster mode), 0 when Redis was unreachable.")
REDIS_USED_MEMORY_BYTES = Gauge("dtq_redis_used_memory_bytes", "Redis used_memory (INFO "
                                "memory; the primary with the least room in cluster mode).")
REDIS_MAXMEMORY_BYTES = Gauge("dtq_redis_maxmemory_bytes", "Redis maxmemory of the same "
                              "server (0 = no limit).")
REDIS_CPU_SECONDS = Gauge("dtq_redis_cpu_seconds", "Redis CPU time since it started, system "
                          "plus user (INFO cpu; summed over primaries): use rate().")


#: Collectors labelled by ``queue`` alone, and by ``queue`` and ``band`` (0..9): every
#: per-queue series, removed by :func:`forget_queue`.
QUEUE_COLLECTORS = (TASKS_ENQUEUED, TASKS_SUCCEEDED, TASKS_FAILED, TASKS_RETRIED,
                    TASKS_DEAD_LETTERED, TASKS_EXPIRED, TASKS_CANCELLED, LEASE_WAIT_SECONDS,
                    TASK_RUN_SECONDS, QUEUE_BACKLOG_AGE_SECONDS, QUEUE_STUCK_TASKS,
                    RATE_LIMITED_READS, RATE_LIMITED_TASKS)
QUEUE_BAND_COLLECTORS = (QUEUE_DEPTH, QUEUE_PENDING)

#: Labelled children by (collector, queue), for the counters and histograms the data path
#: updates (:func:`queue_child`): ``labels()`` hashes and locks on every call, which
#: showed up in the per-task profile. :func:`forget_queue` drops a queue's entries with
#: its series, so a cached child is always the one the registry exports.
_CHILDREN: dict[tuple[int, str], Any] = {}


def queue_child(collector: Any, queue: str) -> Any:
    """``collector.labels(queue=queue)``, cached (one of QUEUE_COLLECTORS)."""
    key = (id(collector), queue)
    child = _CHILDREN.get(key)
    if child is None:
        child = _CHILDREN[key] = collector.labels(queue=queue)
    return child


def counted_queues() -> set[str]:
    """The queues with a series in a collector updated through :func:`queue_child`."""
    return {queue for _, queue in _CHILDREN}


def forget_queue(queue: str) -> None:
    """Remove every series labelled ``queue`` (the queue was deleted) from the
    QUEUE_COLLECTORS and QUEUE_BAND_COLLECTORS. A later use of the name starts new
    series (counters from 0). Call it from the event loop that updates the metrics."""
    for collector in QUEUE_COLLECTORS:
        _CHILDREN.pop((id(collector), queue), None)
        _remove(collector, queue)
    for collector in QUEUE_BAND_COLLECTORS:
        for band in range(10):
            _remove(collector, queue, str(band))


def _remove(collector: Any, *labels: str) -> None:
    """``collector.remove(*labels)``; a series that does not exist is no error."""
    try:
        collector.remove(*labels)
    except KeyError:  # older prometheus-client versions raise for an absent series
        pass


def start_metrics_server(host: str, port: int) -> Any:
    """Serve ``/metrics`` over HTTP on ``host:port`` in a daemon thread.

    Returns:
        What prometheus-client returns (a ``(server, thread)`` pair); call
        ``server.shutdown()`` to stop it.
    """
    result = start_http_server(port, addr=host)
    log.info("metrics listening", extra={"host": host, "port": port})
    return result
