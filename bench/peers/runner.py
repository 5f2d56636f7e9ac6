"""Drive one Python peer inside bench/.peers-venv and print its figures as JSON.

Usage (the orchestrator does this): ``python -m bench.peers.runner PEER --redis-url URL
--sizes JSON --out-dir DIR``. PEER is a module ``bench.peers.<PEER>_peer`` exposing an
``Adapter`` class. The last stdout line is ``BENCH_RESULT {json}``.

Per peer, on its own Redis database, flushed before each step:
  1. enqueue/s, one call per task, one caller (``enqueue_n`` tasks);
  2. a ``backlog_n`` backlog enqueued with the peer's batch call when it has one
     (enqueue_batch/s), else 16 calls in flight for async clients (enqueue_16/s),
     else one by one; then one worker process drains it: drain/s is measured at the
     handler, first to last task, so worker start-up is not counted;
     The drain also gives Redis CPU per task (enqueue + drain) and the worker's CPU
     per task (the handling process, first to last drain task);
  3. a fresh worker, warmed up, gets tasks at a steady rate; e2e latency is
     handler time minus the enqueue timestamp in the payload, and Redis commands per
     task in the window (``INFO commandstats``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

from bench.peers import probe

logger = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    rank = max(0, min(len(ordered) - 1, round(q / 100.0 * len(ordered) + 0.5) - 1))
    return ordered[rank]


async def _wait_file(path: Path, timeout_s: float, proc: subprocess.Popen[Any]) -> dict:
    """Poll for ``path`` (written by the probe) with a deadline; fail if the worker died."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {path.name} within {timeout_s:.0f} s")
        await asyncio.sleep(0.01)
    return json.loads(path.read_text())


class Driver:
    """Runs the three measurements against one adapter."""

    def __init__(self, adapter: Any, redis_url: str, sizes: dict, out_dir: Path) -> None:
        self.adapter = adapter
        self.redis = redis.Redis.from_url(redis_url)
        self.redis_url = redis_url
        self.sizes = sizes
        self.out = out_dir
        self.out.mkdir(parents=True, exist_ok=True)

    def flush(self) -> None:
        """Empty this peer's database and the probe's output files."""
        self.redis.flushdb()
        for f in self.out.glob("*.json"):
            f.unlink()

    def start_worker(self) -> subprocess.Popen[Any]:
        """One worker process of the peer, in its own process group."""
        env = dict(os.environ, BENCH_OUT_DIR=str(self.out), BENCH_REDIS_URL=self.redis_url,
                   PYTHONPATH=str(REPO))
        with open(self.out / "worker.log", "ab") as log:  # the child keeps its own copy
            return subprocess.Popen(self.adapter.worker_cmd(), cwd=REPO, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    @staticmethod
    def stop_worker(proc: subprocess.Popen[Any]) -> None:
        """SIGTERM the worker's group, SIGKILL after 10 s."""
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    async def enqueue_one(self) -> float:
        """Tasks/s enqueued one call at a time."""
        self.flush()
        n = self.sizes["enqueue_n"]
        t0 = time.perf_counter()
        for _ in range(n):
            await self.adapter.enqueue_one(probe.payload("x", n))
        return n / (time.perf_counter() - t0)

    async def fill_backlog(self, n: int) -> dict[str, float]:
        """Enqueue ``n`` drain tasks the fastest way the peer offers; its rate (tasks/s)."""
        items = [probe.payload("d", n) for _ in range(n)]
        t0 = time.perf_counter()
        if getattr(self.adapter, "enqueue_batch", None):
            for i in range(0, n, 500):
                await self.adapter.enqueue_batch(items[i:i + 500])
            return {"enqueue_batch_per_s": n / (time.perf_counter() - t0)}
        if getattr(self.adapter, "concurrent", False):
            sem = asyncio.Semaphore(16)

            async def one(p: dict) -> None:
                async with sem:
                    await self.adapter.enqueue_one(p)
            await asyncio.gather(*(one(p) for p in items))
            return {"enqueue_16_per_s": n / (time.perf_counter() - t0)}
        for p in items:
            await self.adapter.enqueue_one(p)
        return {}

    async def drain(self) -> dict[str, float]:
        """Fill a backlog, then drain/s of one worker process (first to last handler call).

        Also the cost per task of the batch path: Redis CPU (µs, ``INFO cpu``, backlog
        enqueue + drain), the worker's CPU (µs, the handling process between its first
        and last drain task) and their sum.
        """
        self.flush()
        n = self.sizes["backlog_n"]
        redis0 = redis_cpu_s(self.redis)
        figures = await self.fill_backlog(n)
        proc = self.start_worker()
        try:
            done = await _wait_file(self.out / "drain.json", self.sizes["timeout_s"], proc)
            redis_us = (redis_cpu_s(self.redis) - redis0) / n * 1e6
        finally:
            self.stop_worker(proc)
        span_s = (done["last_ns"] - done["first_ns"]) / 1e9
        figures["drain_per_s"] = (done["n"] - 1) / span_s
        worker_us = done["cpu_s"] / max(1, done["n"] - 1) * 1e6
        figures.update({"redis_cpu_us_per_task_batch": redis_us,
                        "worker_cpu_us_per_task_batch": worker_us,
                        "all_cpu_us_per_task_batch": redis_us + worker_us})
        return figures

    async def latency(self, windows: int) -> dict[str, float]:
        """e2e p50/p99 (ms) at a steady rate, median over ``windows`` windows."""
        self.flush()
        proc = self.start_worker()
        try:
            ready = self.out / "ready.json"
            deadline = time.monotonic() + 60
            while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
                await self.adapter.enqueue_one(probe.payload("w", 1))
                await asyncio.sleep(0.05)
            rate, count = self.sizes["latency_rate"], int(self.sizes["latency_rate"]
                                                         * self.sizes["latency_s"])
            p50s, p99s, cmds = [], [], []
            for w in range(windows):
                (self.out / "latency.json").unlink(missing_ok=True)
                calls0 = redis_calls(self.redis)
                t0 = time.monotonic()
                for i in range(count):
                    delay = t0 + i / rate - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await self.adapter.enqueue_one(probe.payload("l", (w + 1) * count))
                lat = (await _wait_file(self.out / "latency.json", 60, proc))["latencies_ms"]
                cmds.append((redis_calls(self.redis) - calls0) / count)
                p50s.append(_pct(lat[-count:], 50))
                p99s.append(_pct(lat[-count:], 99))
        finally:
            self.stop_worker(proc)
        return {"e2e_p50_ms": statistics.median(p50s), "e2e_p99_ms": statistics.median(p99s),
                "redis_cmds_per_task_unary_200": statistics.median(cmds)}


def redis_cpu_s(r: redis.Redis) -> float:
    """CPU seconds the Redis server has used (``INFO cpu`` user + sys)."""
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def redis_calls(r: redis.Redis) -> int:
    """Commands the Redis server has run (``INFO commandstats``), without INFO itself."""
    return sum(v["calls"] for k, v in r.info("commandstats").items() if k != "cmdstat_info")


def _median_runs(runs: list[dict[str, float]]) -> dict[str, float]:
    keys = runs[0].keys()
    return {k: round(statistics.median(r[k] for r in runs), 3) for k in keys}


async def run(peer: str, redis_url: str, sizes: dict, out_dir: Path) -> dict[str, Any]:
    """All figures of one peer (medians over ``sizes['repeat']`` runs)."""
    os.environ["BENCH_REDIS_URL"] = redis_url
    module = importlib.import_module(f"bench.peers.{peer}_peer")
    adapter = module.Adapter()
    await adapter.start()
    driver = Driver(adapter, redis_url, sizes, out_dir)
    try:
        rep = sizes["repeat"]
        result: dict[str, Any] = {"peer": peer, "config": adapter.config,
                                  "version": adapter.version()}
        result["enqueue_one_per_s"] = round(statistics.median(
            [await driver.enqueue_one() for _ in range(rep)]), 1)
        result.update(_median_runs([await driver.drain() for _ in range(rep)]))
        result.update({k: round(v, 3) for k, v in (await driver.latency(rep)).items()})
        return result
    finally:
        driver.flush()
        await adapter.close()


def main() -> None:
    """CLI entry: run one peer and print ``BENCH_RESULT {json}``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("peer")
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--sizes", required=True, help="JSON dict of workload sizes")
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    result = asyncio.run(run(args.peer, args.redis_url, json.loads(args.sizes),
                             Path(args.out_dir)))
    print("BENCH_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    sys.exit(main())
