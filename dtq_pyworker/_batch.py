"""Batch handlers: leased tasks of one type gathered into one handler call.

A :class:`Batch` gathers held leases of its task type until ``max_size`` are in or
``max_wait_ms`` passed since its first item; it then waits for one handler slot like
a single task and calls the handler once with every item's payload and context.
Each item is still its own lease: it is heartbeated while gathered and running, and
acked or failed on its own (its own retries), from the per-item results the handler
returns, or from the one error it raised for the whole batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from dtq_pyworker._execute import Execution, Outcome, arm_on_start, exception_outcome, fail_item
from dtq_pyworker.codec import decode_payload, encode_result

#: Largest ``max_size`` of a batch handler (one Ack call carries up to 256 items).
MAX_BATCH_SIZE = 10_000
#: Largest ``max_wait_ms`` of a batch handler (1 min).
MAX_BATCH_WAIT_MS = 60_000


@dataclass
class BatchHandler:
    """A registered batch handler.

    Attributes:
        fn: ``fn(payloads: list, ctxs: list[TaskContext]) -> list | None``.
        is_async: True when calling it returns an awaitable to run on the loop.
        max_size: Most tasks per call, 1..:data:`MAX_BATCH_SIZE`.
        max_wait_ms: Longest a batch waits for more tasks after its first, in ms,
            0..:data:`MAX_BATCH_WAIT_MS` (0: run with whatever is held now).
    """

    fn: Callable[..., Any]
    is_async: bool
    max_size: int
    max_wait_ms: float

    @classmethod
    def wrap(cls, task_type: str, fn: Callable[..., Any], max_size: int,
             max_wait_ms: float) -> BatchHandler:
        """Check the limits and classify ``fn`` as async or sync.

        Raises:
            ValueError: Naming the field and the task type: ``max_size`` not an int
                in 1..10000, or ``max_wait_ms`` not a number in 0..60000.
            TypeError: ``fn`` is not callable.
        """
        if isinstance(max_size, bool) or not isinstance(max_size, int) \
                or not 1 <= max_size <= MAX_BATCH_SIZE:
            raise ValueError(f"max_size of batch task {task_type!r}: an int in "
                             f"1..{MAX_BATCH_SIZE}, got {max_size!r}")
        if isinstance(max_wait_ms, bool) or not isinstance(max_wait_ms, (int, float)) \
                or not 0 <= max_wait_ms <= MAX_BATCH_WAIT_MS:
            raise ValueError(f"max_wait_ms of batch task {task_type!r}: a number of ms in "
                             f"0..{MAX_BATCH_WAIT_MS}, got {max_wait_ms!r}")
        if not callable(fn):
            raise TypeError(f"handler of batch task {task_type!r} is not callable")
        call = None if inspect.isfunction(fn) else type(fn).__dict__.get("__call__")
        is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)
        return cls(fn, is_async, max_size, max_wait_ms)


@dataclass(eq=False)
class Batch:
    """Items of one task type gathered for one call (then run in one slot).

    Attributes:
        task_type: The items' task type.
        handler: Its batch handler.
        items: Executions still part of the batch (a stopped item leaves it while
            the batch waits; once running, it stays but is reported at its stop).
        key: Key of the running batch in ``Runtime.running`` (one slot).
        timer: Closes the batch at ``max_wait_ms`` after its first item.
        handle: The asyncio task running it (None while gathering or waiting).
        in_thread: True while a sync batch handler occupies a pool thread.
        on_thread_exit: As :class:`Execution`'s: frees the slot of a stopped batch
            whose thread returns late.
    """

    task_type: str
    handler: BatchHandler
    items: list[Execution] = field(default_factory=list)
    key: str = ""
    timer: asyncio.TimerHandle | None = None
    handle: asyncio.Task[None] | None = None
    in_thread: bool = False
    on_thread_exit: Callable[[], None] | None = None

    def timeout_ms(self) -> int:
        """The batch's time limit: the smallest non-zero ``timeout_ms`` of its items
        (0 = none)."""
        limits = [ex.task.timeout_ms for ex in self.items if ex.task.timeout_ms]
        return min(limits) if limits else 0

    def log_extra(self) -> dict[str, Any]:
        """Fields for log records about this batch."""
        return {"task_type": self.task_type, "batch_size": len(self.items)}


async def execute_batch(batch: Batch, executor: Executor) -> dict[str, Outcome]:
    """Run ``batch``'s handler once under the batch's time limit; map what it did.

    Returns:
        Outcome by lease id of every item: a payload that cannot be decoded fails
        alone (``PayloadDecodeError``) and is not passed on; a handler that raised
        fails every item with that error (each with its own retries); past the time
        limit every item fails as ``Timeout`` (retryable) and has ``ctx.cancelled``
        set; otherwise the results map item by item (:func:`map_results`).
        Cancellation from outside propagates as ``asyncio.CancelledError``.
    """
    outcomes: dict[str, Outcome] = {}
    live: list[Execution] = []
    payloads: list[Any] = []
    for ex in batch.items:
        try:
            payloads.append(decode_payload(ex.task.payload, ex.task.content_type))
            live.append(ex)
        except (ValueError, UnicodeDecodeError) as exc:
            outcomes[ex.task.lease_id] = Outcome(fail=fail_item(
                ex.task.lease_id, "PayloadDecodeError", str(exc), False))
    if not live:
        return outcomes
    timeout_ms = batch.timeout_ms()
    try:
        async with asyncio.timeout(None) as scope:
            arm = arm_on_start(scope, timeout_ms)
            value = await _invoke(batch, payloads, [ex.ctx for ex in live], executor, arm)
    except TimeoutError as exc:
        if not scope.expired():  # the handler raised TimeoutError itself
            return outcomes | {ex.task.lease_id: exception_outcome(ex.task.lease_id, exc)
                               for ex in live}
        for ex in live:
            ex.ctx.cancelled.set()
            outcomes[ex.task.lease_id] = Outcome(fail=fail_item(
                ex.task.lease_id, "Timeout",
                f"batch handler exceeded timeout_ms={timeout_ms} (the smallest of its "
                f"{len(live)} tasks)", True))
        return outcomes
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - the whole batch fails with it
        return outcomes | {ex.task.lease_id: exception_outcome(ex.task.lease_id, exc)
                           for ex in live}
    return outcomes | map_results(live, value)


def map_results(items: Sequence[Execution], value: Any) -> dict[str, Outcome]:
    """Outcome by lease id from what a batch handler returned.

    ``None`` acks every item with a null result. A list or tuple of ``len(items)``
    entries maps in order: an exception instance (e.g. ``Retry``) fails that item
    alone as if its own handler had raised it, anything else is its result. Another
    value fails every item as ``BatchResultError`` (not retryable: the handler is
    wrong, a retry would not help).
    """
    if value is None:
        value = [None] * len(items)
    if not isinstance(value, (list, tuple)) or len(value) != len(items):
        got = f"{len(value)} results" if isinstance(value, (list, tuple)) \
            else f"a {type(value).__name__}"
        message = f"batch handler returned {got} for {len(items)} tasks (want a list, same order)"
        return {ex.task.lease_id: Outcome(fail=fail_item(ex.task.lease_id, "BatchResultError",
                                                         message, False)) for ex in items}
    outcomes = {}
    for ex, result in zip(items, value, strict=True):
        lease_id = ex.task.lease_id
        if isinstance(result, BaseException):
            outcomes[lease_id] = exception_outcome(lease_id, result)
            continue
        try:
            outcomes[lease_id] = Outcome(ack_result=encode_result(result))
        except (TypeError, ValueError) as exc:
            outcomes[lease_id] = Outcome(fail=fail_item(lease_id, "ResultEncodeError",
                                                        str(exc), False))
    return outcomes


async def _invoke(batch: Batch, payloads: list[Any], ctxs: list[Any], executor: Executor,
                  arm: Callable[[float], None]) -> Any:
    fn = batch.handler.fn
    if batch.handler.is_async:
        arm(time.monotonic())
        return await fn(payloads, ctxs)
    loop = asyncio.get_running_loop()

    def call() -> Any:
        batch.in_thread = True
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(arm, time.monotonic())
        try:
            return fn(payloads, ctxs)
        finally:
            batch.in_thread = False
            if batch.on_thread_exit is not None:
                batch.on_thread_exit()

    try:
        value = await loop.run_in_executor(executor, call)
    except asyncio.CancelledError:
        for ctx in ctxs:  # the thread cannot be killed: ask it to stop
            ctx.cancelled.set()
        raise
    if inspect.isawaitable(value):
        value = await value
    return value
