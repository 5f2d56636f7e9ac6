"""Optional py-spy profile of the gateway during the dtq measurements (``--profile``).

py-spy is a bench tool installed into bench/.peers-venv (requirements-peers.txt);
``py-spy`` on PATH is used first. Profiles are collapsed stacks (``--format raw``,
one ``frame;frame;... count`` line per stack, native frames included, GIL-holding
samples only) that flamegraph tools read; the bench also keeps the top self-time
frames and the top inclusive dtq_gateway frames in its JSON.
"""

from __future__ import annotations

import collections
import logging
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Self

from bench.common import REPO

logger = logging.getLogger(__name__)


def py_spy() -> str | None:
    """Path of a py-spy binary, or None."""
    local = REPO / "bench" / ".peers-venv" / "bin" / "py-spy"
    return shutil.which("py-spy") or (str(local) if local.exists() else None)


class GatewayProfile:
    """``with GatewayProfile(pid, path):`` samples ``pid`` at 250 Hz while inside."""

    def __init__(self, pid: int, path: Path | None) -> None:
        self.pid = pid
        self.path = path
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        exe = py_spy()
        if self.path is None or exe is None:
            return self
        self.proc = subprocess.Popen(
            [exe, "record", "-p", str(self.pid), "-o", str(self.path), "--format", "raw",
             "--rate", "250", "--native", "--gil"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def top_frames(path: Path, n: int = 15, contains: str = "") -> list[tuple[str, float]]:
    """Top ``n`` frames by share of samples (%) in a collapsed-stack file.

    Args:
        path: collapsed stacks written by py-spy ``--format raw``.
        n: how many frames to return.
        contains: "" ranks leaf frames (self time); otherwise frames whose text
            contains it are ranked by inclusive time (each counted once per stack).
    """
    if not path.exists():
        return []
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")
        total += int(count)
        if not contains:
            counts[frames[-1]] += int(count)
        else:
            for frame in {f for f in frames if contains in f}:
                counts[frame] += int(count)
    return [(frame, round(100.0 * c / total, 1)) for frame, c in counts.most_common(n)]
