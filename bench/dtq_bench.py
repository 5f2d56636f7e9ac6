"""dtq measured end to end: a gateway subprocess and one ``dtq-pyworker`` process.

Figures (same names as the peers where they mean the same): enqueue/s (unary, one
caller and 16 in flight; EnqueueBatch of 500), drain/s of a backlog with one worker
process, e2e p50/p99 at a steady rate, gateway, Redis and worker CPU per task; the
scale figures are in
:mod:`bench.dtq_scale`. Skips with ``na`` when the gateway cannot start.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import redis

from bench.common import REPO, Sizes, latency_summary, median_of, proc_cpu_s, stop_process
from bench.peers import probe
from bench.profile import GatewayProfile, top_frames
from tests.support.redis_server import free_port

logger = logging.getLogger(__name__)
QUEUE = "bench"  # drained by the worker: backlog and latency tasks
ENQUEUE_QUEUE = "bench_enqueue"  # unary enqueue figures: never consumed
WORKER_CONCURRENCY = 32
DTQ_TIMEOUT_S = {False: 480.0, True: 180.0}  # whole dtq part, full / quick (s)


def _pb() -> tuple[Any, Any]:
    from dtq_proto import dtq_pb2, dtq_pb2_grpc

    return dtq_pb2, dtq_pb2_grpc


def commandstats(r: redis.Redis) -> dict[str, int]:
    """Redis calls so far per command (INFO commandstats), e.g. ``{"evalsha": 120}``."""
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items()}


def redis_cpu_s(r: redis.Redis) -> float:
    """CPU seconds the Redis server has used (``INFO cpu`` user + sys)."""
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def per_task_commands(before: dict[str, int], after: dict[str, int],
                      tasks: int) -> dict[str, float]:
    """Redis commands per task by command between two snapshots, plus ``total``.

    Commands run inside Lua scripts count too (Redis counts them in commandstats).

    The bench's own INFO calls are excluded; everything else in the window is the
    gateway's (it is the only other Redis client while the phase runs).
    """
    out = {cmd: round((after[cmd] - before.get(cmd, 0)) / tasks, 2) for cmd in after
           if cmd != "info" and after[cmd] != before.get(cmd, 0)}
    out["total"] = round(sum(out.values()), 2)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def gateway_available() -> str | None:
    """None when ``python -m dtq_gateway`` and dtq_pyworker are importable, else why not."""
    for module in ("dtq_gateway.cli", "dtq_gateway.server", "dtq_pyworker", "dtq_proto.dtq_pb2"):
        try:
            __import__(module)
        except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
            return f"gateway not available ({module}: {type(exc).__name__})"
    return None


class Processes:
    """The gateway and worker subprocesses of one dtq run (logs in a temp directory)."""

    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.dir = Path(tempfile.mkdtemp(prefix="dtq-bench-"))
        self.gateway: subprocess.Popen[bytes] | None = None
        self.worker: subprocess.Popen[bytes] | None = None

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(self.dir / f"{name}.log", "ab") as log:  # the child keeps its own copy
            return subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ, **env), stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def start_gateway(self) -> None:
        """Start the gateway; logs at WARNING unless BENCH_DTQ_LOG_LEVEL says otherwise."""
        level = os.environ.get("BENCH_DTQ_LOG_LEVEL", "WARNING")
        self.gateway = self._spawn("gateway", [
            sys.executable, "-m", "dtq_gateway", "--redis-url", self.redis_url,
            "--listen", self.target, "--metrics-port", "0", "--log-level", level], {})

    def start_worker(self, out_dir: Path) -> None:
        """Start one dtq-pyworker process (async no-op handler)."""
        exe = str(Path(sys.executable).parent / "dtq-pyworker")
        self.worker = self._spawn("worker", [
            exe, "bench.dtq_worker:make_worker", "--target", self.target, "--queues", QUEUE,
            "--concurrency", str(WORKER_CONCURRENCY), "--log-level", "WARNING"],
            {"BENCH_OUT_DIR": str(out_dir), "PYTHONPATH": str(REPO)})

    def stop_worker(self) -> None:
        """SIGTERM the worker (it drains), SIGKILL after 10 s."""
        if self.worker:
            stop_process(self.worker)
            self.worker = None

    def stop(self) -> None:
        """Stop both processes; keep the logs only when something failed."""
        self.stop_worker()
        if self.gateway:
            stop_process(self.gateway)

    def log_tail(self, name: str) -> str:
        """Last lines of a process log, for ``na`` reasons."""
        path = self.dir / f"{name}.log"
        lines = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
        return " | ".join(lines[-2:])[-300:]


def _request(pb: Any, kind: str, count: int, queue: str = QUEUE) -> Any:
    data = json.dumps(probe.payload(kind, count)).encode()
    return pb.EnqueueRequest(queue=queue, task_type="noop", payload=data,
                             content_type="application/json")


async def _wait_file(path: Path, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {path.name} within {timeout_s:.0f} s")
        await asyncio.sleep(0.01)
    return json.loads(path.read_text())


class DtqBench:
    """The throughput and latency measurements against a running gateway."""

    def __init__(self, procs: Processes, sizes: Sizes, channel: grpc.aio.Channel,
                 profile_dir: Path | None = None) -> None:
        self.procs = procs
        self.profile_dir = profile_dir
        self.sizes = sizes
        self.pb, grpc_mod = _pb()
        self.stub = grpc_mod.BrokerStub(channel)
        self.redis = redis.Redis.from_url(procs.redis_url)
        self.commands: dict[str, dict[str, float]] = {}  # phase -> Redis calls per task
        self.out = procs.dir / "probe"
        self.out.mkdir(exist_ok=True)

    async def enqueue_unary(self, n: int, in_flight: int) -> float:
        """Unary Enqueue calls/s with ``in_flight`` callers (tasks stay queued)."""
        async def caller(count: int) -> None:
            for _ in range(count):
                await self.stub.Enqueue(_request(self.pb, "x", 0, ENQUEUE_QUEUE))
        t0 = time.perf_counter()
        await asyncio.gather(*(caller(n // in_flight) for _ in range(in_flight)))
        return (n // in_flight) * in_flight / (time.perf_counter() - t0)

    async def enqueue_batch(self, n: int, kind: str = "d") -> float:
        """EnqueueBatch tasks/s, 500 per call."""
        items = [_request(self.pb, kind, n) for _ in range(n)]
        t0 = time.perf_counter()
        for i in range(0, n, 500):
            reply = await self.stub.EnqueueBatch(self.pb.EnqueueBatchRequest(items=items[i:i + 500]))
            if any(r.HasField("error") for r in reply.results):
                raise RuntimeError("EnqueueBatch item failed")
        return n / (time.perf_counter() - t0)

    async def drain(self) -> dict[str, float]:
        """EnqueueBatch a backlog, then drain/s of one worker, and the cost per task of
        this batch path (µs): gateway CPU and Redis CPU (enqueue + drain), the worker's
        CPU (first to last drain task, as the peers measure it) and their sum."""
        for f in self.out.glob("*.json"):
            f.unlink()
        n = self.sizes.backlog_n
        pid = self.procs.gateway.pid  # type: ignore[union-attr]
        cpu0, cmds0, redis0 = proc_cpu_s(pid), commandstats(self.redis), redis_cpu_s(self.redis)
        batch = await self.enqueue_batch(n)
        self.procs.start_worker(self.out)
        try:
            with GatewayProfile(pid, self._profile_path("drain")):
                done = await _wait_file(self.out / "drain.json", self.sizes.peer_timeout_s)
            cpu1, cmds1, redis1 = (proc_cpu_s(pid), commandstats(self.redis),
                                   redis_cpu_s(self.redis))
        finally:
            self.procs.stop_worker()
        self.commands["batch"] = per_task_commands(cmds0, cmds1, n)
        gateway_us, redis_us = (cpu1 - cpu0) / n * 1e6, (redis1 - redis0) / n * 1e6
        worker_us = done["cpu_s"] / max(1, done["n"] - 1) * 1e6
        return {"enqueue_batch_per_s": batch,
                "drain_per_s": (done["n"] - 1) / ((done["last_ns"] - done["first_ns"]) / 1e9),
                "gateway_cpu_us_per_task_batch": gateway_us,
                "redis_cpu_us_per_task_batch": redis_us,
                "worker_cpu_us_per_task_batch": worker_us,
                "all_cpu_us_per_task_batch": gateway_us + redis_us + worker_us}

    async def latency(self) -> dict[str, float]:
        """e2e p50/p99 (ms) at a steady rate with unary Enqueue, and gateway CPU per task."""
        for f in self.out.glob("*.json"):
            f.unlink()
        self.procs.start_worker(self.out)
        try:
            deadline = time.monotonic() + 60
            while not (self.out / "ready.json").exists() and time.monotonic() < deadline:
                await self.stub.Enqueue(_request(self.pb, "w", 1))
                await asyncio.sleep(0.05)
            idle = await self._idle_cpu_per_s(2.0)
            with GatewayProfile(self.procs.gateway.pid,  # type: ignore[union-attr]
                                self._profile_path("steady_200")):
                figures = await self._paced_windows()
        finally:
            self.procs.stop_worker()
        per_task_idle_us = idle / self.sizes.latency_rate * 1e6  # idle CPU spread over tasks
        figures["gateway_idle_cpu_pct"] = idle * 100
        figures["gateway_cpu_us_per_task_unary_net"] = max(
            0.0, figures["gateway_cpu_us_per_task_unary"] - per_task_idle_us)
        return figures

    def _profile_path(self, phase: str) -> Path | None:
        return self.profile_dir / f"gateway-{phase}.txt" if self.profile_dir else None

    def profile_summary(self) -> dict[str, Any]:
        """Top self-time frames of each profiled phase (empty without ``--profile``)."""
        if not self.profile_dir:
            return {}
        top: dict[str, Any] = {}
        for phase in ("drain", "steady_200"):
            path = self.profile_dir / f"gateway-{phase}.txt"
            top[f"{phase} self"] = top_frames(path)
            top[f"{phase} dtq_gateway inclusive"] = top_frames(path, contains="dtq_gateway")
        return {"profile_dir": str(self.profile_dir), "profile_top": top}

    async def _idle_cpu_per_s(self, seconds: float) -> float:
        """Gateway CPU s per s with the worker connected and no tasks (background duties)."""
        pid = self.procs.gateway.pid  # type: ignore[union-attr]
        cpu0, t0 = proc_cpu_s(pid), time.monotonic()
        await asyncio.sleep(seconds)  # a measurement window, not synchronisation
        return (proc_cpu_s(pid) - cpu0) / (time.monotonic() - t0)

    async def _paced_windows(self) -> dict[str, float]:
        rate = self.sizes.latency_rate
        count = int(rate * self.sizes.latency_s)
        pid = self.procs.gateway.pid  # type: ignore[union-attr]
        runs = []
        for w in range(self.sizes.repeat):
            (self.out / "latency.json").unlink(missing_ok=True)
            cpu0, cmds0 = proc_cpu_s(pid), commandstats(self.redis)
            t0 = time.monotonic()
            for i in range(count):
                delay = t0 + i / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                await self.stub.Enqueue(_request(self.pb, "l", (w + 1) * count))
            lat = (await _wait_file(self.out / "latency.json", 60))["latencies_ms"][-count:]
            cpu_us = (proc_cpu_s(pid) - cpu0) / count * 1e6
            self.commands["unary_200"] = per_task_commands(
                cmds0, commandstats(self.redis), count)
            s = latency_summary(lat)
            runs.append({"e2e_p50_ms": s["p50_ms"], "e2e_p99_ms": s["p99_ms"],
                         "gateway_cpu_us_per_task_unary": cpu_us})
        return median_of(runs)


async def _wait_gateway(procs: Processes, channel: grpc.aio.Channel, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await asyncio.wait_for(channel.channel_ready(), timeout=0.5)
            return
        except TimeoutError:
            if procs.gateway and procs.gateway.poll() is not None:
                raise RuntimeError(f"gateway exited: {procs.log_tail('gateway')}") from None
            if time.monotonic() > deadline:
                raise RuntimeError("gateway did not answer within "
                                   f"{timeout_s:.0f} s: {procs.log_tail('gateway')}") from None


async def _run(redis_url: str, sizes: Sizes, procs: Processes,
               profile_dir: Path | None) -> dict[str, Any]:
    from bench import dtq_scale

    procs.start_gateway()
    async with grpc.aio.insecure_channel(procs.target) as channel:
        await _wait_gateway(procs, channel, 30)
        bench = DtqBench(procs, sizes, channel, profile_dir)
        result: dict[str, Any] = {"peer": "dtq"}
        ones, sixteens = [], []
        for _ in range(sizes.repeat):
            ones.append(await bench.enqueue_unary(sizes.enqueue_n, 1))
            sixteens.append(await bench.enqueue_unary(sizes.enqueue_n * 2, 16))
        result.update(median_of([{"enqueue_one_per_s": a, "enqueue_16_per_s": b}
                                 for a, b in zip(ones, sixteens)]))
        result.update(median_of([await bench.drain() for _ in range(sizes.repeat)]))
        result.update(await bench.latency())
        through = sizes.repeat * (sizes.backlog_n + int(sizes.latency_rate * sizes.latency_s))
        result.update(await dtq_scale.run_scale(redis_url, sizes, procs, channel, through))
        result.update(bench.profile_summary())
        result["redis_commands_per_task"] = bench.commands
        for phase, calls in bench.commands.items():
            result[f"gateway_redis_cmds_per_task_{phase}"] = calls["total"]
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in result.items()}


def run_dtq(redis_url: str, sizes: Sizes, profile_dir: Path | None = None) -> dict[str, Any]:
    """All dtq figures, or ``{"na": reason}`` when the gateway is missing or fails.

    Args:
        redis_url: the private server (db 0 is used).
        sizes: workload sizes.
        profile_dir: when set, py-spy profiles of the gateway are written there.
    """
    missing = gateway_available()
    if missing:
        return {"peer": "dtq", "na": missing}
    procs = Processes(redis_url)
    try:
        if profile_dir:
            profile_dir.mkdir(parents=True, exist_ok=True)
        result = asyncio.run(asyncio.wait_for(_run(redis_url, sizes, procs, profile_dir),
                                              timeout=DTQ_TIMEOUT_S[sizes.backlog_n < 20000]))
        shutil.rmtree(procs.dir, ignore_errors=True)
        return result
    except Exception as exc:
        logger.exception("dtq bench failed")
        return {"peer": "dtq", "na": f"{type(exc).__name__}: {exc} (logs in {procs.dir})"}
    finally:
        procs.stop()
