"""Feeds the Prometheus collectors of :mod:`dtq_gateway.metrics` from the data path.

Kept apart from the collectors so the hot path calls one small function per
outcome. Times are epoch ms from Redis; histograms take seconds.
"""

from __future__ import annotations

from dtq_gateway import metrics
from dtq_proto import dtq_pb2


def outcome(queue: str, kind: str, started_at_ms: int, finished_at_ms: int) -> None:
    """Count one finished Ack/Fail item (kind: ok, retry, dead, released, cancelled)."""
    if kind == "ok":
        metrics.TASKS_SUCCEEDED.labels(queue=queue).inc()
        if started_at_ms and finished_at_ms >= started_at_ms:
            metrics.TASK_RUN_SECONDS.labels(queue=queue).observe(
                (finished_at_ms - started_at_ms) / 1000.0)
    elif kind == "retry":
        metrics.TASKS_FAILED.labels(queue=queue).inc()
        metrics.TASKS_RETRIED.labels(queue=queue).inc()
    elif kind == "dead":
        metrics.TASKS_FAILED.labels(queue=queue).inc()
        metrics.TASKS_DEAD_LETTERED.labels(queue=queue).inc()
    elif kind == "cancelled":
        metrics.TASKS_CANCELLED.labels(queue=queue).inc()


def enqueued(queue: str, count: int = 1) -> None:
    """Count tasks accepted by Enqueue/EnqueueBatch (deduplicated ones excluded)."""
    metrics.TASKS_ENQUEUED.labels(queue=queue).inc(count)


def delivered(task: dtq_pb2.LeasedTask) -> None:
    """Observe the lease wait of a delivered task (creation to lease)."""
    if task.created_at_ms and task.leased_at_ms >= task.created_at_ms:
        metrics.LEASE_WAIT_SECONDS.labels(queue=task.queue).observe(
            (task.leased_at_ms - task.created_at_ms) / 1000.0)
