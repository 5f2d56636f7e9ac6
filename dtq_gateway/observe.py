"""Feeds the Prometheus collectors of :mod:`dtq_gateway.metrics` from the data path.

Kept apart from the collectors so the hot path calls one small function per
outcome. Times are epoch ms from Redis; histograms take seconds.
"""

from __future__ import annotations

from collections.abc import Mapping

from dtq_gateway import metrics
from dtq_gateway.metrics import queue_child as _child
from dtq_proto import dtq_pb2


def outcome(queue: str, kind: str, started_at_ms: int, finished_at_ms: int) -> None:
    """Count one finished Ack/Fail item (kind: ok, retry, dead, released, cancelled)."""
    if kind == "ok":
        _child(metrics.TASKS_SUCCEEDED, queue).inc()
        if started_at_ms and finished_at_ms >= started_at_ms:
            _child(metrics.TASK_RUN_SECONDS, queue).observe(
                (finished_at_ms - started_at_ms) / 1000.0)
    elif kind == "retry":
        _child(metrics.TASKS_FAILED, queue).inc()
        _child(metrics.TASKS_RETRIED, queue).inc()
    elif kind == "dead":
        _child(metrics.TASKS_FAILED, queue).inc()
        _child(metrics.TASKS_DEAD_LETTERED, queue).inc()
    elif kind == "cancelled":
        _child(metrics.TASKS_CANCELLED, queue).inc()


def enqueued(queue: str, count: int = 1) -> None:
    """Count tasks accepted by Enqueue/EnqueueBatch (deduplicated ones excluded)."""
    _child(metrics.TASKS_ENQUEUED, queue).inc(count)


def delivered(task: dtq_pb2.LeasedTask) -> None:
    """Observe the lease wait of a delivered task (creation to lease)."""
    if task.created_at_ms and task.leased_at_ms >= task.created_at_ms:
        _child(metrics.LEASE_WAIT_SECONDS, task.queue).observe(
            (task.leased_at_ms - task.created_at_ms) / 1000.0)


def reaped(queue: str, counts: Mapping[str, int]) -> None:
    """Count the reaper's outcomes for one queue (reclaim.lua replies): a lost lease
    retried, dead-lettered on its last attempt, or ending a cancel in progress."""
    for outcome_name, collector in (("retried", metrics.TASKS_RETRIED),
                                    ("dead_lettered", metrics.TASKS_DEAD_LETTERED),
                                    ("cancelled", metrics.TASKS_CANCELLED)):
        if counts.get(outcome_name):
            _child(collector, queue).inc(counts[outcome_name])


def expired(queue: str, count: int = 1) -> None:
    """Count tasks found past their deadline before they started: by the scheduler
    when they came due, or by the dispatcher when a read reached them."""
    _child(metrics.TASKS_EXPIRED, queue).inc(count)
