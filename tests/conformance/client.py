"""A thin producer/observer client for the conformance suite, written only against dtq.v1."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import grpc

from dtq_proto import dtq_pb2, dtq_pb2_grpc

TaskStatus = dtq_pb2.TaskStatus
TERMINAL = frozenset({TaskStatus.TASK_STATUS_SUCCEEDED, TaskStatus.TASK_STATUS_DEAD_LETTERED,
                      TaskStatus.TASK_STATUS_CANCELLED, TaskStatus.TASK_STATUS_EXPIRED})
POLL_S = 0.02

RETRY_S = 0.1  # wait between retries of an UNAVAILABLE call, bounded by its deadline


def status_name(status: int) -> str:
    """TaskStatus name, e.g. TASK_STATUS_ACTIVE."""
    return TaskStatus.Name(status)


class _BearerToken(grpc.UnaryUnaryClientInterceptor):
    """Adds ``authorization: Bearer <token>`` to every unary call."""

    def __init__(self, token: str) -> None:
        self.entry = ("authorization", f"Bearer {token}")

    def intercept_unary_unary(self, continuation, details, request):
        metadata = [*(details.metadata or []), self.entry]
        return continuation(details._replace(metadata=metadata), request)


class ConformanceClient:
    """Enqueue tasks and watch their records through Broker and Admin.

    Args:
        address: gateway host:port.
        token: bearer token sent with every call ("" = none).
    """

    def __init__(self, address: str, token: str = "") -> None:
        self.channel = grpc.insecure_channel(address)
        if token:
            self.channel = grpc.intercept_channel(self.channel, _BearerToken(token))
        self.broker = dtq_pb2_grpc.BrokerStub(self.channel)
        self.admin = dtq_pb2_grpc.AdminStub(self.channel)

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()

    def enqueue(self, queue: str, task_type: str, payload: Any = None, *,
                content_type: str = "", **fields: Any) -> str:
        """Enqueue one task; ``payload`` is JSON-encoded unless it is bytes. Returns task_id."""
        if not isinstance(payload, bytes):
            payload = b"" if payload is None else json.dumps(
                payload, separators=(",", ":"), ensure_ascii=False).encode()
        request = dtq_pb2.EnqueueRequest(queue=queue, task_type=task_type, payload=payload,
                                         content_type=content_type, **fields)
        return self.broker.Enqueue(request, timeout=10).task_id

    def get(self, task_id: str) -> dtq_pb2.Task:
        """The task record; retries transient UNAVAILABLE (e.g. during a gateway restart)."""
        deadline = time.monotonic() + 15
        while True:
            try:
                return self.broker.GetTask(dtq_pb2.GetTaskRequest(task_id=task_id),
                                           timeout=5).task
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                time.sleep(RETRY_S)

    def wait_for(self, task_id: str, predicate: Callable[[dtq_pb2.Task], bool],
                 timeout_s: float, what: str = "condition") -> dtq_pb2.Task:
        """Poll GetTask until ``predicate`` holds; AssertionError after ``timeout_s`` seconds."""
        deadline = time.monotonic() + timeout_s
        while True:
            task = self.get(task_id)
            if predicate(task):
                return task
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"task {task_id}: {what} not reached within {timeout_s}s; last record:\n"
                    f"{describe(task)}")
            time.sleep(POLL_S)

    def wait_terminal(self, task_id: str, timeout_s: float) -> dtq_pb2.Task:
        """Poll until the task is terminal."""
        return self.wait_for(task_id, lambda t: t.status in TERMINAL, timeout_s, "terminal state")

    def wait_all_terminal(self, task_ids: list[str], timeout_s: float) -> list[dtq_pb2.Task]:
        """Poll until every task is terminal (one shared deadline)."""
        deadline = time.monotonic() + timeout_s
        return [self.wait_terminal(t, max(0.0, deadline - time.monotonic())) for t in task_ids]

    def cancel(self, task_id: str) -> dtq_pb2.CancelTaskResponse:
        """CancelTask."""
        return self.broker.CancelTask(dtq_pb2.CancelTaskRequest(task_id=task_id,
                                                                reason="conformance"), timeout=10)

    def worker_info(self, worker_id: str) -> dtq_pb2.WorkerInfo | None:
        """The worker's record from its last heartbeat (ListWorkers), or None."""
        workers = self.admin.ListWorkers(dtq_pb2.ListWorkersRequest(), timeout=10).workers
        return next((w for w in workers if w.worker_id == worker_id), None)

    def dead_letters(self, queue: str) -> list[dtq_pb2.DeadLetter]:
        """Dead-letter entries of a queue (first page of 500)."""
        request = dtq_pb2.ListDeadLettersRequest(queue=queue, page_size=500)
        return list(self.admin.ListDeadLetters(request, timeout=10).entries)


def describe(task: dtq_pb2.Task) -> str:
    """Readable one-task summary for assertion messages."""
    attempts = [(a.attempt, a.worker_id, a.outcome, a.error_class, a.error_message)
                for a in task.attempts]
    return (f"status={status_name(task.status)} attempt={task.attempt}/{task.max_attempts} "
            f"worker={task.worker_id} last_error={task.last_error_class}:{task.last_error} "
            f"cancel_requested={task.cancel_requested} attempts={attempts}")


def max_overlap(intervals: list[tuple[int, int]]) -> int:
    """Largest number of half-open [start, end) intervals that overlap at one instant."""
    events = sorted([(end, -1) for _, end in intervals] + [(start, 1) for start, _ in intervals])
    best = current = 0
    for _, delta in events:  # at equal times, ends (-1) sort before starts (+1)
        current += delta
        best = max(best, current)
    return best
