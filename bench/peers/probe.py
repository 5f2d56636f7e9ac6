"""Handler-side recorder for peer workers (stdlib only, thread safe).

Every benchmark task carries a small dict payload ``{"k": kind, "t": ns, "n": count,
"pad": ...}``: kind ``w`` (warm-up: marks the worker ready), ``d`` (drain: first and
last handler time, and the handling process's CPU time between them, are recorded) or
``l`` (latency: ``now - t`` is recorded). When a kind reaches its expected count ``n``
the figures are written as JSON into
``$BENCH_OUT_DIR`` (atomically: write then rename) for the driver to pick up.
Times are CLOCK_MONOTONIC ns, comparable between processes on one machine.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

_lock = threading.Lock()
_state: dict[str, Any] = {"d": 0, "first": 0, "lat": [], "ready": False}
PAD = "x" * 60  # with the other fields the encoded payload is ~100 bytes


def payload(kind: str, count: int) -> dict[str, Any]:
    """A benchmark task payload stamped with the current monotonic time (ns)."""
    return {"k": kind, "t": time.monotonic_ns(), "n": count, "pad": PAD}


def _write(name: str, data: Any) -> None:
    out = Path(os.environ["BENCH_OUT_DIR"])
    tmp = out / (name + ".part")
    tmp.write_text(json.dumps(data))
    tmp.rename(out / name)


def hit(p: dict[str, Any]) -> None:
    """Record one handled task (the no-op handler body of every peer)."""
    now = time.monotonic_ns()
    kind = p["k"]
    with _lock:
        if kind == "w":
            if not _state["ready"]:
                _state["ready"] = True
                _write("ready.json", {"t": now})
        elif kind == "d":
            _state["d"] += 1
            if _state["d"] == 1:
                _state["first"] = now
                _state["cpu_first"] = time.process_time()
            if _state["d"] == p["n"]:
                _write("drain.json", {"first_ns": _state["first"], "last_ns": now,
                                      "n": _state["d"],
                                      "cpu_s": time.process_time() - _state["cpu_first"]})
        elif kind == "l":
            _state["lat"].append((now - p["t"]) / 1e6)
            if len(_state["lat"]) == p["n"]:
                _write("latency.json", {"latencies_ms": _state["lat"]})
