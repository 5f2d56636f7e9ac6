"""TaskContext: what a handler knows about the task it runs."""

from __future__ import annotations

import threading
from collections.abc import Mapping
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
