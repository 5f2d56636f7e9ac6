"""The child side of ``Worker(pool="process")`` (see :mod:`dtq_pyworker._procpool`).

What runs in a handler process: its set-up (signals, an exit when the worker ends,
the progress pipe and the cancel flag), finding the handler by module and qualified
name, and running it into a plain reply: ``("ack", result bytes)`` or ``("fail",
FailItem bytes)``, never a pickled exception, which could fail to unpickle in the
worker and break the executor.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from dtq_pyworker._execute import exception_outcome, fail_item
from dtq_pyworker.codec import encode_result
from dtq_pyworker.context import TaskContext

#: Seconds between two looks at the cancel flag in ``ctx.cancelled.wait``.
FLAG_POLL_S = 0.05
#: Seconds between two looks at the worker process where there is no pidfd.
WORKER_POLL_S = 1.0


def resolve(module: str, qualname: str) -> Callable[..., Any]:
    """Import ``module`` and follow ``qualname``; a TaskHandle gives its function."""
    obj: Any = sys.modules["__main__"] if module == "__main__" else importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    fn = getattr(obj, "fn", None)  # @worker.task leaves a TaskHandle at the name
    found: Callable[..., Any] = (fn if fn is not None and getattr(obj, "task_type", None)
                                 is not None else obj)
    return found


class SharedFlag:
    """``ctx.cancelled`` in a child: a byte of shared memory the parent sets.

    Offers the ``threading.Event`` methods a handler uses (``is_set``, ``wait``,
    ``set``); ``wait`` polls every :data:`FLAG_POLL_S` seconds.
    """

    def __init__(self, value: Any) -> None:
        self._value = value

    def is_set(self) -> bool:
        """True once the handler must stop."""
        return bool(self._value.value)

    def set(self) -> None:
        """Set the flag (from the parent, or the handler itself)."""
        self._value.value = 1

    def wait(self, timeout: float | None = None) -> bool:
        """Block until set or ``timeout`` seconds passed; returns :meth:`is_set`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(FLAG_POLL_S)
        return True


_CHILD: dict[str, Any] = {}


def child_init(progress_conn: Any, cancel_value: Any, worker_pid: int) -> None:
    """Set up a new handler process (the executor's initializer)."""
    # A terminal's SIGINT, or a SIGTERM sent to the whole process group (systemd,
    # `kill -- -PGID`), reaches the children too: the parent drains, lets running
    # handlers finish within its grace and stops the children itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _exit_with_worker(worker_pid)
    _CHILD.update(conn=progress_conn, flag=SharedFlag(cancel_value))


def _exit_with_worker(worker_pid: int) -> None:
    """Exit this child when the worker process ends, however it ends.

    A worker killed outright (SIGKILL, the OOM killer) cannot stop its children, and
    they would wait for calls forever; their parent is the forkserver, which lives as
    long as any of them. A daemon thread waits on a pidfd of the worker (Linux), or
    polls it every :data:`WORKER_POLL_S` seconds elsewhere.
    """
    def watch() -> None:
        try:
            fd = os.pidfd_open(worker_pid)
        except (AttributeError, OSError):  # no pidfd here: poll
            while _alive(worker_pid):
                time.sleep(WORKER_POLL_S)
        else:
            select.select([fd], [], [])  # readable once the process has ended
        os._exit(1)

    threading.Thread(target=watch, name="dtq-worker-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _send_progress(ctx: TaskContext) -> None:
    report = ctx.take_progress()
    if report is not None:
        _CHILD["conn"].send((ctx.lease_id, report[0], report[1]))


def child_run(module: str, qualname: str, payload: Any,
               fields: dict[str, Any]) -> tuple[str, bytes]:
    """Run one handler in the child: ``("ack", result)`` or ``("fail", FailItem bytes)``."""
    ctx = TaskContext(**fields, cancelled=_CHILD["flag"])
    ctx._on_progress = functools.partial(_send_progress, ctx)
    try:
        value = resolve(module, qualname)(payload, ctx)
        if inspect.isawaitable(value):
            value = asyncio.run(_awaited(value))
    except Exception as exc:  # noqa: BLE001 - every handler error becomes a Fail item
        fail = exception_outcome(ctx.lease_id, exc).fail
        assert fail is not None  # an exception's outcome is always a Fail item
        return "fail", fail.SerializeToString()
    try:
        return "ack", encode_result(value)
    except (TypeError, ValueError) as exc:
        return "fail", fail_item(ctx.lease_id, "ResultEncodeError", str(exc),
                                 False).SerializeToString()


async def _awaited(value: Any) -> Any:
    return await value
