"""Focused dtq measurements used while optimizing (not part of ``make bench``).

``.venv/bin/python -m bench.focus drain`` enqueues a backlog with EnqueueBatch, drains
it with one ``dtq-pyworker`` process and prints, per task, the gateway's CPU split into
the enqueue and the drain phase, the worker's and Redis's CPU, and how many items each
``Ack`` call carried (from the gateway's ``/metrics``).

``.venv/bin/python -m bench.focus enqueue`` prints unary Enqueue calls/s and gateway
CPU per call, one caller and 16 in flight.

``.venv/bin/python -m bench.focus memory`` prints Redis ``used_memory`` growth per task
(bytes) with the backlog queued, and again once it was drained: a finished task's
record stays for ``DTQ_TASK_RETENTION_S`` (the figure docs/deploy.md sizes Redis with).

Both start their own redis-server and gateway, like the bench. CPU comes from
``/proc/<pid>/stat`` (gateway, worker) and ``INFO cpu`` (Redis), in µs per task.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import urllib.request
from typing import Any

import grpc
import redis

from bench.common import PAYLOAD_BYTES, Sizes, private_redis, proc_cpu_s
from bench.dtq_bench import DtqBench, Processes, _wait_file
from tests.support.redis_server import free_port

_ACK_COUNT = re.compile(
    r'dtq_rpc_duration_seconds_count\{code="OK",method="/dtq.v1.Broker/Ack"\} (\S+)')


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


def _commands(r: redis.Redis, n: int) -> dict[str, float]:
    """Calls per task of each command since the last CONFIG RESETSTAT (EVALSHA counted
    once per call, the commands its script ran counted under their own names)."""
    stats = r.info("commandstats")
    per = {k.removeprefix("cmdstat_"): v["calls"] / n for k, v in stats.items()}
    per = {k: round(v, 3) for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if v >= 0.001}
    per["TOTAL"] = round(sum(v for k, v in per.items() if k not in ("evalsha", "eval")), 2)
    # usec per task by command (EVALSHA's includes the commands its scripts ran)
    per["usec"] = {k.removeprefix("cmdstat_"): round(v["usec"] / n, 2) for k, v in
                   sorted(stats.items(), key=lambda kv: -kv[1]["usec"]) if v["usec"] / n >= 0.05}
    return per


def _redis_cpu_s(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def _drain(procs: Processes, bench: DtqBench, metrics_port: int, n: int) -> dict[str, Any]:
    r = redis.Redis.from_url(procs.redis_url)
    pid = procs.gateway.pid  # type: ignore[union-attr]
    await bench.enqueue_batch(500, kind="x")  # warm-up, never consumed
    r.config_resetstat()
    c0, r0 = proc_cpu_s(pid), _redis_cpu_s(r)
    rate = await bench.enqueue_batch(n)
    c1, r1 = proc_cpu_s(pid), _redis_cpu_s(r)
    cmd_enqueue = _commands(r, n)
    r.config_resetstat()
    for f in bench.out.glob("*.json"):
        f.unlink()
    procs.start_worker(bench.out)
    done = await _wait_file(bench.out / "drain.json", 300)
    c2, r2 = proc_cpu_s(pid), _redis_cpu_s(r)
    cmd_drain = _commands(r, n)
    worker_s = proc_cpu_s(procs.worker.pid)  # type: ignore[union-attr]
    procs.stop_worker()
    text = await asyncio.to_thread(_get, f"http://127.0.0.1:{metrics_port}/metrics")
    acks = sum(float(x) for x in _ACK_COUNT.findall(text)) or 1.0
    us = 1e6 / n
    return {"batch_per_s": round(rate),
            "drain_per_s": round((done["n"] - 1) / ((done["last_ns"] - done["first_ns"]) / 1e9)),
            "gateway_us_enqueue": round((c1 - c0) * us, 1),
            "gateway_us_drain": round((c2 - c1) * us, 1),
            "worker_us": round(worker_s * us, 1), "redis_us_enqueue": round((r1 - r0) * us, 1),
            "redis_us_drain": round((r2 - r1) * us, 1), "ack_calls": int(acks),
            "items_per_ack": round(n / acks, 1),
            "commands_per_task": round(cmd_enqueue["TOTAL"] + cmd_drain["TOTAL"], 2),
            "commands_enqueue": cmd_enqueue, "commands_drain": cmd_drain}


async def _enqueue(procs: Processes, bench: DtqBench) -> dict[str, Any]:
    pid = procs.gateway.pid  # type: ignore[union-attr]
    await bench.enqueue_unary(1000, 16)  # warm-up
    out: dict[str, Any] = {}
    for in_flight, n in ((1, 3000), (16, 10000)):
        c0 = proc_cpu_s(pid)
        rate = await bench.enqueue_unary(n, in_flight)
        out[f"enqueue_{in_flight}_per_s"] = round(rate)
        out[f"gateway_us_per_call_{in_flight}"] = round((proc_cpu_s(pid) - c0) / n * 1e6, 1)
    return out


async def _memory(procs: Processes, bench: DtqBench, n: int) -> dict[str, Any]:
    r = redis.Redis.from_url(procs.redis_url)
    await bench.enqueue_batch(500, kind="x")  # warm-up: stream, group, indexes exist
    before = r.info("memory")["used_memory"]
    await bench.enqueue_batch(n)
    queued = r.info("memory")["used_memory"]
    procs.start_worker(bench.out)
    await _wait_file(bench.out / "drain.json", 300)
    procs.stop_worker()
    finished = r.info("memory")["used_memory"]
    return {"tasks": n, "payload_bytes": PAYLOAD_BYTES,
            "bytes_per_queued_task": round((queued - before) / n),
            "bytes_per_finished_task": round((finished - before) / n)}


async def _main(what: str, n: int) -> None:
    server = private_redis()
    procs = Processes(server.url)
    metrics_port = free_port()
    procs.gateway = procs._spawn("gateway", [
        sys.executable, "-m", "dtq_gateway", "--redis-url", server.url, "--listen",
        procs.target, "--metrics-port", str(metrics_port), "--log-level", "WARNING"], {})
    try:
        channel = grpc.aio.insecure_channel(procs.target)
        await asyncio.wait_for(channel.channel_ready(), 20)
        bench = DtqBench(procs, Sizes.for_mode(False, 1), channel)
        if what == "drain":
            result = await _drain(procs, bench, metrics_port, n)
        elif what == "memory":
            result = await _memory(procs, bench, n)
        else:
            result = await _enqueue(procs, bench)
        print(json.dumps(result))
    finally:
        procs.stop()
        server.cleanup()


def main() -> None:
    """Command line: ``python -m bench.focus {drain,enqueue,memory} [-n N]``."""
    p = argparse.ArgumentParser(prog="python -m bench.focus", description=__doc__.split("\n")[0])
    p.add_argument("what", choices=["drain", "enqueue", "memory"])
    p.add_argument("-n", type=int, default=20000, help="backlog size for drain and memory (tasks)")
    args = p.parse_args()
    asyncio.run(_main(args.what, args.n))


if __name__ == "__main__":
    main()
