"""The process pool of ``Worker(pool="process")``: handlers in child processes that
can be killed.

A thread cannot be stopped from outside, so a handler stuck in C code (or a blocking
call) keeps its thread however long its ``timeout_ms``. Here each handler slot is a
``concurrent.futures.ProcessPoolExecutor`` with one process: a timed-out or cancelled
handler's process is killed (SIGKILL) and the slot replaced, and a process that dies
(a segfault, ``os.abort()``, the OOM killer) breaks only its own one-process
executor, so only its own task fails. One executor per slot is what makes that
possible: a shared ``ProcessPoolExecutor`` fails every pending task when one of its
processes dies and cannot tell which process runs which call.

The parent keeps the lease stream, heartbeats and acks; a child only runs the
handler and sends back a plain result (an encoded result or a serialized FailItem,
never a pickled exception). Progress reports travel over a pipe per slot; the
cancel flag a child reads (``ctx.cancelled``) is one shared byte, without locks, so a
killed child can leave nothing locked behind.

Children start from a ``forkserver`` (``spawn`` where there is none) that has the
handler modules imported, so a replacement takes milliseconds, not an interpreter
start; they find their handler by module and qualified name, which is why handlers
must be module-level functions. What runs inside a child is in
:mod:`dtq_pyworker._procchild`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from dtq_proto import dtq_pb2
from dtq_pyworker import _procchild
from dtq_pyworker._execute import STOP_CANCELLED, Execution, Handler, Outcome, fail_item
from dtq_pyworker._procchild import child_init, child_run, resolve
from dtq_pyworker.context import TaskContext

log = logging.getLogger(__name__)

#: error_class of a task whose handler process died under it (retryable).
PROCESS_DIED = "HandlerProcessDied"
#: Seconds to wait for a dead child's exit status before reporting without it.
EXIT_STATUS_WAIT_S = 2.0
#: Seconds between attempts to replace a slot whose new process failed to start.
REPLACE_RETRY_S = 1.0
#: Seconds :meth:`ProcessPool.close` waits for replacement children still starting.
CLOSE_WAIT_S = 10.0


def handler_ref(task_type: str, fn: Callable[..., Any]) -> tuple[str, str]:
    """Where a child finds ``fn``: ``(module, qualified name)``.

    Raises:
        ValueError: Naming the task type: ``fn`` is not reachable by module and
            qualified name (a lambda, a nested function, a callable object, or a
            module attribute that is something else), so no child could import it.
    """
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if module and qualname and "<" not in qualname:
        with contextlib.suppress(ImportError, AttributeError):
            if resolve(module, qualname) is fn:
                return module, qualname
    raise ValueError(f"handler of {task_type!r}: pool='process' needs a module-level function "
                     f"(children import it by module and name), got {fn!r}")


def _ctx_fields(ctx: TaskContext) -> dict[str, Any]:
    return {name: getattr(ctx, name) for name in (
        "task_id", "queue", "task_type", "attempt", "max_attempts", "timeout_ms",
        "worker_id", "lease_id", "priority", "content_type", "payload_bytes",
        "traceparent", "tracestate")} | {"metadata": dict(ctx.metadata)}


# -- parent side --------------------------------------------------------------------
@dataclass(eq=False)
class _Slot:
    executor: ProcessPoolExecutor
    pid: int
    process: Any  # multiprocessing.Process, for its exit status; None if unknown
    cancel_value: Any
    progress_in: Any
    current: Execution | None = field(default=None)


class ProcessPool:
    """Handler slots, each one child process, for ``Worker(pool="process")``.

    Args:
        size: Slots (the worker's ``concurrency``), >= 1.
        handlers: Handlers by task type; each must be a module-level function.
        cancel_grace_s: How long a cancelled handler may finish on its own (it sees
            ``ctx.cancelled`` set) before its process is killed, in seconds >= 0.

    Raises:
        ValueError: A handler is not a module-level function (see :func:`handler_ref`).
    """

    def __init__(self, size: int, handlers: Mapping[str, Handler],
                 cancel_grace_s: float) -> None:
        self.size = size
        self.cancel_grace_s = cancel_grace_s
        self._refs = {t: handler_ref(t, h.fn) for t, h in handlers.items()}
        methods = mp.get_all_start_methods()
        self._mp = mp.get_context("forkserver" if "forkserver" in methods else "spawn")
        if self._mp.get_start_method() == "forkserver":
            # takes effect when the forkserver starts (the first pool of this process)
            self._mp.set_forkserver_preload(sorted(
                {_procchild.__name__} | {m for m, _ in self._refs.values() if m != "__main__"}))
        self._idle: asyncio.Queue[_Slot] = asyncio.Queue()
        self._slots: set[_Slot] = set()
        self._replacing: set[asyncio.Task[None]] = set()
        self._closed = False
        #: Child processes started so far (the first ``size`` plus replacements).
        self.started = 0

    async def start(self) -> None:
        """Start every slot's process (they start in parallel; returns when all run)."""
        if self._mp.get_start_method() == "forkserver":
            _start_forkserver()
        slots = await asyncio.gather(*(asyncio.to_thread(self._new_slot)
                                       for _ in range(self.size)))
        for slot in slots:
            self._add(slot)

    async def run_handler(self, ex: Execution, payload: Any,
                          arm: Callable[[float], None]) -> Outcome:
        """Run the handler of ``ex`` in a free slot's process.

        ``arm(time.monotonic())`` is called when the child gets the call, so the
        time limit counts from there. When the call is cancelled (timeout, lease
        lost, drain, or cancellation: after ``cancel_grace_s`` only), the child is
        killed and its slot replaced, and ``asyncio.CancelledError`` propagates.

        Returns:
            The outcome: the handler's result or error, or a retryable
            :data:`PROCESS_DIED` failure when the process died under it.
        """
        module, qualname = self._refs[ex.task.task_type]
        while True:
            slot = await self._idle.get()
            slot.cancel_value.value = 0
            slot.current = ex
            try:
                future = slot.executor.submit(child_run, module, qualname, payload,
                                              _ctx_fields(ex.ctx))
                break
            except BrokenProcessPool:  # the child died while idle (the OOM killer, say)
                log.warning("idle handler process died; replacing it", extra={"pid": slot.pid})
                self._replace(slot)
        arm(time.monotonic())
        try:
            kind, data = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            await self._stop(slot, future, ex)
            raise
        except BrokenProcessPool:
            return await self._died(slot, ex)
        self._free(slot)
        if kind == "ack":
            return Outcome(ack_result=data)
        return Outcome(fail=dtq_pb2.FailItem.FromString(data))

    async def close(self) -> None:
        """Stop every process: idle ones exit, busy ones are killed; waits for them."""
        self._closed = True
        if self._replacing:  # a child being started is shut down as soon as it runs
            await asyncio.wait(self._replacing, timeout=CLOSE_WAIT_S)
        for task in list(self._replacing):
            task.cancel()
        await asyncio.gather(*self._replacing, return_exceptions=True)
        slots = list(self._slots)
        for slot in slots:
            if slot.current is not None:
                _kill(slot)
            self._drop(slot)
        def shut_down() -> None:
            for s in slots:
                s.executor.shutdown(wait=True)

        await asyncio.to_thread(shut_down)

    def _new_slot(self) -> _Slot:
        """Start one child and wait until it runs (blocking: call in a thread)."""
        progress_in, progress_out = self._mp.Pipe(duplex=False)
        cancel_value = self._mp.RawValue("b", 0)
        executor = ProcessPoolExecutor(1, mp_context=self._mp, initializer=child_init,
                                       initargs=(progress_out, cancel_value, os.getpid()))
        pid = executor.submit(os.getpid).result()
        # the Process object gives the dead child's exit status; a private attribute,
        # so its absence only loses the status from the error message
        process = (getattr(executor, "_processes", None) or {}).get(pid)
        progress_out.close()
        self.started += 1
        return _Slot(executor, pid, process, cancel_value, progress_in)

    def _add(self, slot: _Slot) -> None:
        if self._closed:
            slot.executor.shutdown(wait=False)
            return
        self._slots.add(slot)
        asyncio.get_running_loop().add_reader(slot.progress_in.fileno(), self._progress, slot)
        self._idle.put_nowait(slot)

    def _free(self, slot: _Slot) -> None:
        slot.current = None
        self._idle.put_nowait(slot)

    def _progress(self, slot: _Slot) -> None:
        """A child sent progress (runs on the loop): hand it to the running task's ctx."""
        try:
            while slot.progress_in.poll():
                lease_id, percent, message = slot.progress_in.recv()
                ex = slot.current
                if ex is not None and ex.task.lease_id == lease_id:
                    ex.ctx.progress(percent, message)
        except (EOFError, OSError, ValueError):  # the pipe broke with the child
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(slot.progress_in.fileno())

    async def _stop(self, slot: _Slot, future: Future[Any], ex: Execution) -> None:
        """The call was cancelled: let a cancelled handler finish within the grace,
        else kill its process and replace the slot."""
        slot.cancel_value.value = 1
        if ex.stop_reason == STOP_CANCELLED and self.cancel_grace_s > 0 and not future.done():
            waited = asyncio.wrap_future(future)
            # killed below, the child's future ends with BrokenProcessPool: read it, or
            # asyncio logs "Future exception was never retrieved" at ERROR
            waited.add_done_callback(_retrieve)
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([waited], timeout=self.cancel_grace_s)
        if future.done() and not future.cancelled() and future.exception() is None:
            self._free(slot)  # it returned in time: the process is fine
            return
        _kill(slot)
        log.warning("handler process killed", extra={
            "task_id": ex.task.task_id, "pid": slot.pid,
            "stop": ex.stop_reason or "timeout"})
        self._replace(slot)

    async def _died(self, slot: _Slot, ex: Execution) -> Outcome:
        status = ""
        # The executor's own thread joins the dead process; wait for that rather than
        # join it here: under a forkserver the exit status is one read from a pipe,
        # and two readers racing would leave one with a made-up 255.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.to_thread(slot.executor.shutdown, True),
                                   EXIT_STATUS_WAIT_S)
            if slot.process is not None:
                status = _exit_status(slot.process.exitcode)
        log.error("handler process died", extra={
            "task_id": ex.task.task_id, "pid": slot.pid, "status": status or "unknown"})
        self._replace(slot)
        message = f"handler process {slot.pid} died while running the task"
        return Outcome(fail=fail_item(ex.task.lease_id, PROCESS_DIED,
                                      f"{message} ({status})" if status else message, True))

    def _replace(self, slot: _Slot) -> None:
        self._drop(slot)
        task = asyncio.get_running_loop().create_task(self._start_replacement(),
                                                      name="dtq-process-slot")
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    def _drop(self, slot: _Slot) -> None:
        self._slots.discard(slot)
        slot.current = None
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(slot.progress_in.fileno())
        slot.progress_in.close()
        slot.executor.shutdown(wait=False, cancel_futures=True)

    async def _start_replacement(self) -> None:
        while not self._closed:
            try:
                self._add(await asyncio.to_thread(self._new_slot))
                return
            except Exception:  # keep the pool its size; say why it shrank
                log.exception("cannot start a handler process; retrying")
                await asyncio.sleep(REPLACE_RETRY_S)


def _start_forkserver() -> None:
    """Start the forkserver (if not yet running) with SIGTERM ignored.

    A SIGTERM sent to the whole process group (systemd, ``kill -- -PGID``) would end
    it, and with it every child's exit-status pipe: each executor would take its
    child for dead and fail its task. An ignored signal stays ignored across exec, so
    it is ignored while the forkserver starts; ``signal.signal`` only works on the
    main thread, elsewhere the forkserver starts on first use with the defaults.
    """
    from multiprocessing import forkserver

    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a future's outcome as seen (its exception is expected and handled)."""
    if not future.cancelled():
        future.exception()


def _kill(slot: _Slot) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(slot.pid, signal.SIGKILL)


def _exit_status(code: int | None) -> str:
    if code is None:
        return ""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by signal {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit status {code}"
