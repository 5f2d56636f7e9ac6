"""Runs one handler and turns what happened into an Ack or a Fail item."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from dtq_proto import dtq_pb2
from dtq_pyworker.codec import decode_payload, encode_result
from dtq_pyworker.context import TaskContext
from dtq_pyworker.errors import Retry

MAX_ERROR_MESSAGE_BYTES = 4096
MAX_ERROR_CLASS_BYTES = 128

#: Why a handler was stopped from outside.
STOP_CANCELLED = "cancelled"  # CancelTask: report FAIL_MODE_CANCELLED
STOP_LOST = "lost"            # lease lost: report nothing
STOP_DRAIN = "drain"          # shutdown grace over: report FAIL_MODE_RELEASE


@dataclass
class Handler:
    """A registered handler.

    Attributes:
        fn: The callable ``fn(payload, ctx)``.
        is_async: True when calling it returns an awaitable to run on the loop.
    """

    fn: Callable[..., Any]
    is_async: bool

    @classmethod
    def wrap(cls, fn: Callable[..., Any]) -> Handler:
        """Classify ``fn`` as async (coroutine function) or sync."""
        call = None if inspect.isfunction(fn) else type(fn).__dict__.get("__call__")
        is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)
        return cls(fn, is_async)


@dataclass
class Outcome:
    """What to report for a finished execution (both None = report nothing)."""

    ack_result: bytes | None = None
    fail: dtq_pb2.FailItem | None = None


@dataclass(eq=False)
class Execution:
    """One held lease: buffered until a slot frees, then running.

    Attributes:
        task: The leased task as received.
        ctx: Context handed to the handler.
        handle: The asyncio task running it (None while buffered).
        stop_reason: Set when the execution was stopped from outside.
        in_thread: True while a sync handler still occupies a pool thread.
        on_thread_exit: Called from the pool thread when the sync handler returns
            (set by the runtime once it stopped waiting for a handler still in
            its thread, to give the slot back).
    """

    task: dtq_pb2.LeasedTask
    ctx: TaskContext
    handle: asyncio.Task[None] | None = None
    stop_reason: str | None = None
    in_thread: bool = field(default=False)
    on_thread_exit: Callable[[], None] | None = None


async def execute(handler: Handler, ex: Execution, executor: Executor) -> Outcome:
    """Run the handler of ``ex`` under its timeout and map the result.

    The time limit (``timeout_ms``) counts from the moment the handler starts: for
    a sync handler, when a pool thread picks it up, not when it was queued for one.

    Args:
        handler: The handler for the task type.
        ex: The execution (its ctx.cancelled is set on timeout).
        executor: Thread pool for sync handlers, or the worker's ProcessPool
            (``pool="process"``), which runs every handler in a child process.

    Returns:
        The outcome to report. Cancellation from outside propagates as
        ``asyncio.CancelledError``; the caller maps it with :func:`stop_outcome`.
    """
    task = ex.task
    try:
        payload = decode_payload(task.payload, task.content_type)
    except (ValueError, UnicodeDecodeError) as exc:
        return Outcome(fail=fail_item(task.lease_id, "PayloadDecodeError", str(exc), False))
    try:
        value = await _limited(handler, payload, ex, executor)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - every handler error becomes a Fail item
        return exception_outcome(task.lease_id, exc)
    if isinstance(value, Outcome):  # timed out, or run in a child process: mapped
        return value
    try:
        return Outcome(ack_result=encode_result(value))
    except (TypeError, ValueError) as exc:
        return Outcome(fail=fail_item(task.lease_id, "ResultEncodeError", str(exc), False))


async def _limited(handler: Handler, payload: Any, ex: Execution, executor: Executor) -> Any:
    """The handler's return value, or the Timeout Outcome once ``timeout_ms`` passed
    (``ctx.cancelled`` set); a TimeoutError the handler raised itself propagates."""
    timeout_ms = ex.task.timeout_ms
    try:
        if handler.is_async and not hasattr(executor, "run_handler"):
            # on the loop, the handler starts now: its limit is armed here, with no
            # start callback (the common case of cheap async handlers, kept short)
            async with asyncio.timeout(timeout_ms / 1000.0 if timeout_ms else None) as scope:
                return await handler.fn(payload, ex.ctx)
        async with asyncio.timeout(None) as scope:  # armed when the handler starts
            arm = arm_on_start(scope, timeout_ms)
            return await _invoke(handler, payload, ex, executor, arm)
    except TimeoutError:
        if not scope.expired():
            raise
        ex.ctx.cancelled.set()
        return Outcome(fail=fail_item(ex.task.lease_id, "Timeout",
                                      f"handler exceeded timeout_ms={timeout_ms}", True))


def arm_on_start(scope: asyncio.Timeout, timeout_ms: int) -> Callable[[float], None]:
    """``arm(started)``: start ``scope``'s limit of ``timeout_ms`` (0 = none) at
    ``started``, a time.monotonic() reading taken when the handler started (in its
    thread for a sync handler); later calls change nothing. Call it on the loop."""
    loop = asyncio.get_running_loop()

    def arm(started: float) -> None:
        if not timeout_ms or scope.when() is not None or scope.expired():
            return
        elapsed_s = time.monotonic() - started  # the loop's clock may differ
        with contextlib.suppress(RuntimeError):  # the scope already ended
            scope.reschedule(loop.time() - elapsed_s + timeout_ms / 1000.0)

    return arm


async def _invoke(handler: Handler, payload: Any, ex: Execution, executor: Executor,
                  arm: Callable[[float], None]) -> Any:
    loop = asyncio.get_running_loop()
    run_handler = getattr(executor, "run_handler", None)
    if run_handler is not None:  # a ProcessPool (dtq_pyworker._procpool): an Outcome
        return await run_handler(ex, payload, arm)
    if handler.is_async:
        arm(time.monotonic())
        return await handler.fn(payload, ex.ctx)

    def call() -> Any:
        ex.in_thread = True
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(arm, time.monotonic())
        try:
            return handler.fn(payload, ex.ctx)
        finally:
            ex.in_thread = False
            done = ex.on_thread_exit
            if done is not None:
                done()

    try:
        value = await loop.run_in_executor(executor, call)
    except asyncio.CancelledError:
        ex.ctx.cancelled.set()  # the thread cannot be killed: ask it to stop
        raise
    if inspect.isawaitable(value):  # e.g. a lambda or wrapper around an async function
        value = await value
    return value


def exception_outcome(lease_id: str, exc: BaseException) -> Outcome:
    """Map a handler exception to a Fail item (Retry, non_retryable, other)."""
    message = str(exc) or repr(exc)
    if isinstance(exc, Retry):
        item = fail_item(lease_id, "Retry", message, True)
        item.retry_after_ms = min(86_400_000, round(exc.after_s * 1000))
        return Outcome(fail=item)
    retryable = not bool(getattr(exc, "non_retryable", False))
    return Outcome(fail=fail_item(lease_id, type(exc).__name__, message, retryable))


def stop_outcome(lease_id: str, reason: str | None) -> Outcome | None:
    """Outcome of an execution stopped from outside; None = not a stop we asked for."""
    if reason == STOP_LOST:
        return Outcome()
    if reason == STOP_CANCELLED:
        return Outcome(fail=fail_item(lease_id, "Cancelled", "task cancelled", False,
                                      dtq_pb2.FAIL_MODE_CANCELLED))
    if reason == STOP_DRAIN:
        return Outcome(fail=release_item(lease_id))
    return None


def release_item(lease_id: str) -> dtq_pb2.FailItem:
    """A FAIL_MODE_RELEASE item: hand the task back without spending an attempt."""
    return fail_item(lease_id, "WorkerShutdown", "released by a draining worker", True,
                     dtq_pb2.FAIL_MODE_RELEASE)


def fail_item(lease_id: str, error_class: str, message: str, retryable: bool,
              mode: dtq_pb2.FailMode = dtq_pb2.FAIL_MODE_FAILURE) -> dtq_pb2.FailItem:
    """Build a FailItem with the message and class cut to the proto's limits."""
    return dtq_pb2.FailItem(
        lease_id=lease_id, error_message=_cut(message, MAX_ERROR_MESSAGE_BYTES),
        error_class=_cut(error_class, MAX_ERROR_CLASS_BYTES), retryable=retryable, mode=mode)


def _cut(text: str, limit: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", errors="ignore")
