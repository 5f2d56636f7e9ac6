"""Floors: what raw redis-py loops and an empty gRPC service achieve on this machine.

Every dtq figure is read against these: dtq cannot beat the Redis commands it runs,
nor the gRPC calls it answers.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from typing import Any

import redis

from bench import grpc_floor
from bench.common import PAYLOAD_BYTES, Sizes, latency_summary, pace, repeat

logger = logging.getLogger(__name__)
STREAM = "floor:stream"
GROUP = "floor"
_FIELDS = {"p": b"x" * PAYLOAD_BYTES}


def xadd_one(r: redis.Redis, n: int) -> float:
    """XADD/s, one command per round trip."""
    r.flushdb()
    t0 = time.perf_counter()
    for _ in range(n):
        r.xadd(STREAM, _FIELDS)
    return n / (time.perf_counter() - t0)


def _fill(r: redis.Redis, n: int, batch: int = 500) -> None:
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.xadd(STREAM, _FIELDS)
        if (i + 1) % batch == 0:
            pipe.execute()
    pipe.execute()


def xadd_pipelined(r: redis.Redis, n: int) -> float:
    """XADD/s in pipelines of 500 (no MULTI)."""
    r.flushdb()
    t0 = time.perf_counter()
    _fill(r, n)
    return n / (time.perf_counter() - t0)


def drain(r: redis.Redis, n: int) -> float:
    """Entries/s consumed from an ``n`` backlog: XREADGROUP COUNT 100, then XACK + XDEL."""
    r.flushdb()
    _fill(r, n)
    r.xgroup_create(STREAM, GROUP, id="0")
    done = 0
    t0 = time.perf_counter()
    while done < n:
        reply = r.xreadgroup(GROUP, "c1", {STREAM: ">"}, count=100)
        ids = [entry_id for entry_id, _ in reply[0][1]]
        pipe = r.pipeline(transaction=False)
        pipe.xack(STREAM, GROUP, *ids)
        pipe.xdel(STREAM, *ids)
        pipe.execute()
        done += len(ids)
    return n / (time.perf_counter() - t0)


def _consumer(url: str, count: int, ready: Any, out: Any) -> None:
    """Blocked XREADGROUP loop in its own process; sends latencies (ms) back."""
    r = redis.Redis.from_url(url)
    lat: list[float] = []
    while len(lat) < count:
        reply = r.xreadgroup(GROUP, "c1", {STREAM: ">"}, count=100, block=1000)
        now = time.monotonic_ns()
        for _, fields in (reply[0][1] if reply else []):
            if fields[b"k"] == b"w":
                ready.set()
            else:
                lat.append((now - int(fields[b"t"])) / 1e6)
    out.put(lat)


def latency(url: str, rate: int, seconds: float) -> dict[str, float]:
    """XADD → blocked XREADGROUP latency at a steady ``rate`` (per s) for ``seconds``."""
    r = redis.Redis.from_url(url)
    r.flushdb()
    r.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    count = int(rate * seconds)
    ctx = mp.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_consumer, args=(url, count, ready, out), daemon=True)
    proc.start()
    deadline = time.monotonic() + 30
    while not ready.wait(0.02) and time.monotonic() < deadline:
        r.xadd(STREAM, {"k": "w", "t": time.monotonic_ns()})
    pace(rate, count, lambda i: r.xadd(STREAM, {"k": "l", "t": time.monotonic_ns(),
                                                "p": _FIELDS["p"]}))
    lat = out.get(timeout=60)
    proc.join(timeout=10)
    summary = latency_summary(lat)
    return {"redis_e2e_p50_ms": summary["p50_ms"], "redis_e2e_p99_ms": summary["p99_ms"]}


def redis_floors(url: str, sizes: Sizes) -> dict[str, Any]:
    """All raw-Redis floors (medians over ``sizes.repeat`` runs)."""
    r = redis.Redis.from_url(url)
    n = sizes.backlog_n
    figures = repeat(sizes.repeat, lambda: {
        "redis_xadd_1_per_s": round(xadd_one(r, sizes.enqueue_n * 2), 1),
        "redis_xadd_pipelined_per_s": round(xadd_pipelined(r, n), 1),
        "redis_drain_per_s": round(drain(r, n), 1),
    })
    figures.update(repeat(sizes.repeat, lambda: latency(url, sizes.latency_rate,
                                                        sizes.latency_s)))
    r.flushdb()
    return figures


def run_floors(url: str, sizes: Sizes) -> dict[str, Any]:
    """Redis floors on ``url`` (db 0 of the private server) and the empty gRPC floors."""
    logger.warning("floors: redis ...")
    figures = redis_floors(url, sizes)
    logger.warning("floors: grpc ...")
    figures.update(repeat(sizes.repeat, lambda: grpc_floor.measure(
        sizes.enqueue_n, sizes.backlog_n * 5)))
    return figures
