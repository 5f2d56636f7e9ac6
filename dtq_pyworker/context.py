"""TaskContext: what a handler knows about the task it runs."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass
class TaskContext:
    """Per-execution information handed to a handler as its second argument.

    Attributes:
        task_id: Task id (32 hex characters).
        queue: Queue the task came from.
        task_type: Handler name.
        attempt: This execution's attempt number, 1-based.
        max_attempts: Attempts allowed in total.
        metadata: Metadata given at enqueue.
        timeout_ms: Handler time limit in ms (0 = none).
        worker_id: Id of this worker process.
        lease_id: Opaque lease token of this execution.
        priority: Priority band 0..9.
        content_type: Media type of the payload.
        payload_bytes: The payload exactly as enqueued (bytes), whatever the
            content type; the first handler argument is its decoded form.
        cancelled: Set when the handler must stop (task cancelled, lease lost,
            timeout, or drain deadline). Sync handlers should poll
            ``ctx.cancelled.is_set()``; async handlers are cancelled directly.
        traceparent: W3C traceparent stored with the task ("" when none).
        tracestate: W3C tracestate stored with the task.
    """

    task_id: str
    queue: str
    task_type: str
    attempt: int
    max_attempts: int
    metadata: Mapping[str, str]
    timeout_ms: int
    worker_id: str
    lease_id: str
    priority: int = 5
    content_type: str = ""
    payload_bytes: bytes = field(default=b"", repr=False)
    cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    traceparent: str = ""
    tracestate: str = ""
    #: Latest unsent progress report (percent, message), taken by the next heartbeat
    #: (an early one, about a second after the report).
    _progress: tuple[float, str] | None = field(default=None, repr=False)
    #: Called (from any thread) when a report is stored: wakes the heartbeat loop.
    _on_progress: Callable[[], None] | None = field(default=None, repr=False)

    def progress(self, percent: float, message: str = "") -> None:
        """Report how far the handler got; safe from sync handlers' threads.

        A report wakes the heartbeat loop, which sends it within about a second
        (PROGRESS_DELAY_S in ``dtq_pyworker._session``: at most one early heartbeat per
        second, the latest report wins), so calling this often costs nothing extra and
        a short handler's progress still reaches the gateway. A report still unsent when
        the handler returns or raises goes out on a heartbeat just before its Ack or Fail. The gateway stores the
        latest on the task (GetTask: progress_percent, progress_message) and publishes
        a TASK_PROGRESS event per stored report.

        Args:
            percent: 0..100 (clamped).
            message: short status text, cut to 256 bytes of UTF-8 by the gateway.

        Raises:
            ValueError: ``percent`` is NaN.
        """
        if math.isnan(percent):
            raise ValueError("progress percent must be a number")
        self._progress = (min(100.0, max(0.0, float(percent))), str(message))
        if self._on_progress is not None:
            self._on_progress()

    def take_progress(self) -> tuple[float, str] | None:
        """The unsent report, cleared (used by the heartbeat)."""
        report, self._progress = self._progress, None
        return report
