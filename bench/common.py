"""Helpers shared by the bench parts: a private redis-server, stats, process CPU."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PAYLOAD_BYTES = 100
CLK_TCK = os.sysconf("SC_CLK_TCK")
#: CONFIG SET on the bench's private redis-server (docs/operations.md, "Redis settings").
#: hash-max-ziplist-value is the 6.2 name; 7.x takes it as an alias of the listpack one.
RECOMMENDED_REDIS_CONFIG = {"hash-max-ziplist-value": "1024", "maxmemory-policy": "noeviction"}


def private_redis() -> Any:
    """Start a private redis-server (AOF off, own port and directory), configured like
    the production Redis docs/operations.md recommends: ``hash-max-listpack-value 1024``
    (task records holding a ~100-byte payload keep the compact hash encoding) and
    ``maxmemory-policy noeviction``. Every system in the run uses this server.

    Returns:
        A started ``tests.support.redis_server.RedisServer``; call ``cleanup()``.
    """
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import redis

    from tests.support.redis_server import RedisServer

    server = RedisServer(appendonly=False).start()
    client = redis.Redis.from_url(server.url)
    try:
        for name, value in RECOMMENDED_REDIS_CONFIG.items():
            client.config_set(name, value)
    finally:
        client.close()
    return server


def redis_db_url(base_url: str, db: int) -> str:
    """The same server as ``base_url`` with another database number."""
    return base_url.rsplit("/", 1)[0] + f"/{db}"


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0..100) of ``samples``."""
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(q / 100.0 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def latency_summary(samples_ms: Sequence[float]) -> dict[str, float]:
    """p50/p99/max (ms) and sample count of latencies in ms."""
    return {"p50_ms": round(percentile(samples_ms, 50), 3),
            "p99_ms": round(percentile(samples_ms, 99), 3),
            "max_ms": round(max(samples_ms), 3) if samples_ms else float("nan"),
            "samples": len(samples_ms)}


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-key median of numeric values over repeated runs (others from the first run)."""
    if not runs:
        return {}
    out: dict[str, Any] = {}
    for key, first in runs[0].items():
        values = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
        if isinstance(first, (int, float)) and not isinstance(first, bool) and values:
            out[key] = round(statistics.median(values), 3)
        else:
            out[key] = first
    if len(runs) > 1:
        out["runs"] = len(runs)
    return out


def repeat(n: int, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``fn`` ``n`` times and return the per-key medians."""
    return median_of([fn() for _ in range(max(1, n))])


def proc_cpu_s(pid: int) -> float:
    """User + system CPU time (s) consumed so far by process ``pid`` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_rss_bytes(pid: int) -> int:
    """Resident set size (bytes) of process ``pid`` (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def pace(rate_per_s: float, count: int, send: Callable[[int], None]) -> None:
    """Call ``send(i)`` ``count`` times at a steady ``rate_per_s`` (absolute schedule).

    Sleeping here is pacing, not synchronisation: each call waits for its own
    slot ``t0 + i / rate`` so that a slow call does not shift the later ones.
    """
    t0 = time.monotonic()
    for i in range(count):
        delay = t0 + i / rate_per_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        send(i)


def stop_process(proc: subprocess.Popen[Any], timeout_s: float = 10.0) -> None:
    """SIGTERM a child process (its own group), then SIGKILL after ``timeout_s``."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, 15)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait(timeout=timeout_s)


@dataclass(frozen=True)
class Sizes:
    """Workload sizes of one bench run (counts of tasks, durations in s)."""

    enqueue_n: int
    backlog_n: int
    latency_rate: int
    latency_s: float
    repeat: int
    peer_timeout_s: float
    #: False: peers outside the targets (Dramatiq, Celery, arq, Huey) run once
    repeat_all_peers: bool = False

    @classmethod
    def for_mode(cls, quick: bool, repeat_n: int, repeat_all_peers: bool = False,
                 smoke: bool = False) -> Sizes:
        """Full sizes (issue 6), quick sizes (~2 min) or smoke sizes (every part of the
        bench, as small as it still runs: the test of ``python -m bench``)."""
        if smoke:
            return cls(enqueue_n=200, backlog_n=600, latency_rate=200, latency_s=1.0,
                       repeat=repeat_n, peer_timeout_s=60.0,
                       repeat_all_peers=repeat_all_peers)
        if quick:
            return cls(enqueue_n=1000, backlog_n=3000, latency_rate=200, latency_s=2.0,
                       repeat=repeat_n, peer_timeout_s=120.0,
                       repeat_all_peers=repeat_all_peers)
        return cls(enqueue_n=5000, backlog_n=20000, latency_rate=200, latency_s=5.0,
                   repeat=repeat_n, peer_timeout_s=300.0, repeat_all_peers=repeat_all_peers)


def now_ns() -> int:
    """CLOCK_MONOTONIC in ns: comparable across processes on this machine."""
    return time.monotonic_ns()
