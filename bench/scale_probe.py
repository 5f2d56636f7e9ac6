"""Handled-task counters and the start gate of the scale bench's worker processes.

Stdlib only: imported by the dtq worker (dtq's venv) and by the Taskiq worker
(``bench/.peers-venv``). Each worker process owns one small file, created by the
driver, that it maps into memory; its no-op handler writes ``(count, first_ns,
last_ns)`` there without a system call. The driver reads the files to see when the
backlog has drained. Nothing touches Redis, so the counters cost Redis nothing.

The gate: a worker process imports everything, writes its ready file and blocks in
``sigwait`` until the driver sends SIGUSR1, so Python start-up is not counted in
the worker's CPU per task, and all workers start leasing at the same moment.
"""

from __future__ import annotations

import mmap
import os
import signal
import struct
import time
from pathlib import Path

#: count, first handler time (ns), last handler time (ns); CLOCK_MONOTONIC
RECORD = struct.Struct("<qqq")
GO_SIGNAL = signal.SIGUSR1


def create(path: Path) -> None:
    """Create an all-zero counter file at ``path`` (driver side, before the worker starts)."""
    path.write_bytes(bytes(RECORD.size))


def read(path: Path) -> tuple[int, int, int]:
    """``(count, first_ns, last_ns)`` of one worker's counter file (zeros before its first task)."""
    with open(path, "rb") as f:
        return RECORD.unpack(f.read(RECORD.size))


class Counter:
    """The worker side of a counter file: :meth:`hit` once per handled task."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), RECORD.size)
        self.count = 0
        self.first_ns = 0

    def hit(self) -> None:
        """Record one handled task (monotonic ns); not thread safe: call from one loop."""
        now = time.monotonic_ns()
        if not self.count:
            self.first_ns = now
        self.count += 1
        RECORD.pack_into(self._map, 0, self.count, self.first_ns, now)


def wait_for_go(ready_path: str | os.PathLike[str]) -> None:
    """Write ``ready_path`` (atomically), then block until SIGUSR1 arrives.

    SIGUSR1 stays blocked afterwards in this thread and in the threads it starts, so
    a stray second signal is ignored rather than fatal.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, {GO_SIGNAL})
    tmp = Path(str(ready_path) + ".part")
    tmp.write_text(str(os.getpid()))
    tmp.rename(ready_path)
    signal.sigwait({GO_SIGNAL})
