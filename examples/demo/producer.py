"""Builds the demo's tasks and enqueues them with EnqueueBatch.

One ``file.stats`` task per ``.py`` file of the running Python's standard library
(``site-packages`` excluded), priorities spread over 0..9 by a stable hash of the
path, plus a few deliberately failing tasks so retries and the dead-letter queue
show up: ``file.flaky`` (succeeds on attempt 2 or 3), ``file.poison`` (always
fails, dead-lettered after 2 attempts) and ``file.corrupt`` (non-retryable).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sysconfig
import uuid
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from dtq_proto import dtq_pb2, dtq_pb2_grpc

log = logging.getLogger(__name__)

QUEUE = "demo"
BATCH_SIZE = 200
#: Deliberately failing tasks added to every run.
FLAKY_TASKS = 20
POISON_TASKS = 5
CORRUPT_TASKS = 5
#: Short backoff so retries finish within seconds (ms).
FLAKY_BACKOFF_MS = (100, 1000)
POISON_BACKOFF_MS = (50, 200)
_EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__"}


@dataclass(frozen=True)
class TaskSpec:
    """One task the demo enqueues.

    Attributes:
        task_type: Handler name (``file.stats``, ``file.flaky``, ...).
        payload: JSON-able payload.
        priority: Band 0..9.
        max_attempts: Attempts allowed (0 = gateway default).
        backoff_ms: (base, cap) retry backoff override in ms, or None.
    """

    task_type: str
    payload: dict
    priority: int
    max_attempts: int = 0
    backoff_ms: tuple[int, int] | None = None

    def to_request(self) -> dtq_pb2.EnqueueRequest:
        """The EnqueueRequest for this task on queue ``demo``."""
        req = dtq_pb2.EnqueueRequest(
            queue=QUEUE, task_type=self.task_type, priority=self.priority,
            payload=json.dumps(self.payload).encode(), content_type="application/json",
            max_attempts=self.max_attempts)
        if self.backoff_ms:
            req.retry_policy.backoff_base_ms, req.retry_policy.backoff_cap_ms = self.backoff_ms
        return req


def stdlib_files(limit: int | None = None) -> list[str]:
    """Every ``.py`` file under the standard library directory, sorted.

    Args:
        limit: Keep only the first ``limit`` files (None = all).

    Returns:
        Absolute paths; ``site-packages`` and ``dist-packages`` are skipped.
    """
    root = sysconfig.get_paths()["stdlib"]
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _EXCLUDED_DIRS)
        found.extend(os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py"))
    found.sort()
    return found[:limit] if limit is not None else found


def priority_of(path: str) -> int:
    """Stable priority band 0..9 of a path (crc32, so equal across runs)."""
    return zlib.crc32(path.encode()) % 10


def plan(files: Sequence[str], flaky: int = FLAKY_TASKS, poison: int = POISON_TASKS,
         corrupt: int = CORRUPT_TASKS) -> list[TaskSpec]:
    """The demo's task list: one ``file.stats`` per file, then the failing kinds.

    Args:
        files: Paths to count (the failing kinds reuse them round-robin).
        flaky: Number of ``file.flaky`` tasks (fail on attempt 1, or 1 and 2).
        poison: Number of ``file.poison`` tasks (max_attempts 2, always fail).
        corrupt: Number of ``file.corrupt`` tasks (non-retryable failure).

    Returns:
        Task specs in enqueue order.
    """
    if not files:
        raise ValueError("no files to process")
    specs = [TaskSpec("file.stats", {"path": p}, priority_of(p)) for p in files]

    def pick(i: int) -> str:
        return files[i % len(files)]

    for i in range(flaky):
        path = pick(i)
        specs.append(TaskSpec("file.flaky", {"path": path, "fail_attempts": 1 + i % 2},
                              priority_of(path), max_attempts=3, backoff_ms=FLAKY_BACKOFF_MS))
    for i in range(poison):
        path = pick(flaky + i)
        specs.append(TaskSpec("file.poison", {"path": path}, priority_of(path),
                              max_attempts=2, backoff_ms=POISON_BACKOFF_MS))
    for i in range(corrupt):
        path = pick(flaky + poison + i)
        specs.append(TaskSpec("file.corrupt", {"path": path}, priority_of(path)))
    return specs


#: Waits (s) between the tries of a call or an item answered UNAVAILABLE or
#: RESOURCE_EXHAUSTED: 19 s in all, longer than a Redis failover (7-9 s).
RETRY_DELAYS_S = (0.2, 0.4, 0.8, 1.6, 3.2, 3.2, 3.2, 3.2, 3.2)
RETRYABLE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)
#: The same codes as an ItemError carries them (ints).
RETRYABLE_ITEM_CODES = frozenset(code.value[0] for code in RETRYABLE_CODES)


async def _enqueue_items(stub: dtq_pb2_grpc.BrokerStub, requests: list[dtq_pb2.EnqueueRequest]
                         ) -> list[dtq_pb2.EnqueueBatchResult]:
    """EnqueueBatch ``requests``: a call answered UNAVAILABLE or RESOURCE_EXHAUSTED is
    resent whole, items answered so (a primary failing over while the others took their
    items) are resent alone, after each of RETRY_DELAYS_S. Every item carries an
    idempotency key, so a resend of what was stored after all stores nothing twice.
    One result per request, in order.

    Raises:
        grpc.aio.AioRpcError: the call failed otherwise, or still after the last delay.
    """
    results: list[dtq_pb2.EnqueueBatchResult | None] = [None] * len(requests)
    pending = list(range(len(requests)))
    for delay_s in (*RETRY_DELAYS_S, None):
        try:
            resp = await stub.EnqueueBatch(dtq_pb2.EnqueueBatchRequest(
                items=[requests[i] for i in pending]), timeout=30)
        except grpc.aio.AioRpcError as err:
            if err.code() not in RETRYABLE_CODES or delay_s is None:
                raise
            log.warning("EnqueueBatch %s, retrying in %.1fs", err.code().name, delay_s)
        else:
            retry = []
            for i, res in zip(pending, resp.results):
                if (res.HasField("error") and res.error.code in RETRYABLE_ITEM_CODES
                        and delay_s is not None):
                    retry.append(i)
                else:
                    results[i] = res
            if not retry:
                break
            log.warning("%d item(s) UNAVAILABLE, resending in %.1fs", len(retry), delay_s)
            pending = retry
        await asyncio.sleep(delay_s)
    return [r for r in results if r is not None]


async def enqueue_all(stub: dtq_pb2_grpc.BrokerStub, specs: Sequence[TaskSpec],
                      on_batch: Callable[[list[tuple[str, TaskSpec]]], None],
                      batch_size: int = BATCH_SIZE
                      ) -> tuple[list[tuple[str, TaskSpec]], list[str]]:
    """Enqueue every spec with EnqueueBatch, ``batch_size`` items per call.

    Args:
        stub: Broker stub on an aio channel.
        specs: Tasks to enqueue, in order.
        on_batch: Called with the (task_id, spec) pairs of each accepted batch.
        batch_size: Items per EnqueueBatch call (1..1000).

    Returns:
        (task_id, spec) for every accepted task in enqueue order, and one message
        per refused item (a refused item does not stop the others).

    Raises:
        grpc.aio.AioRpcError: A whole call failed for good.
    """
    accepted: list[tuple[str, TaskSpec]] = []
    errors: list[str] = []
    run_id = uuid.uuid4().hex[:12]  # this run's keys: a retried call dedupes, a new run not
    for start in range(0, len(specs), batch_size):
        chunk = specs[start:start + batch_size]
        requests = []
        for n, spec in enumerate(chunk, start):
            req = spec.to_request()
            req.idempotency_key = f"demo:{run_id}:{n}"
            requests.append(req)
        results = await _enqueue_items(stub, requests)
        batch: list[tuple[str, TaskSpec]] = []
        for spec, res in zip(chunk, results):
            if res.HasField("error"):
                errors.append(f"{spec.task_type} {spec.payload.get('path')}: "
                              f"{res.error.reason} {res.error.message}")
            else:
                batch.append((res.task_id, spec))
        accepted.extend(batch)
        on_batch(batch)
    return accepted, errors


def display_path(path: str) -> str:
    """A path relative to the stdlib root, for messages."""
    try:
        return str(Path(path).relative_to(sysconfig.get_paths()["stdlib"]))
    except ValueError:
        return path
