"""What idle queues cost: one gateway over the leftovers of N drained queues.

Usage::

    python -m bench.idle_queues --queues 5000 [--code DIR] [--json PATH]

Starts a private redis-server, writes the leftovers of ``--queues`` drained queues
directly (per queue: ten empty band streams, each with the group and the consumer of
the worker that once leased from it, and the registry entry), then runs one gateway
(``python -m dtq_gateway`` from ``--code``, default this checkout, so an older tree can
be measured the same way) with a 2 s visibility timeout and measures:

* idle Redis load: ``total_commands_processed`` delta over ``--idle-s`` seconds;
* lost lease: worker A leases the one task of queue ``live`` and goes silent (stream
  open, no heartbeat); worker B (heartbeating) waits on the same queue; the time from
  A's lease to B's is the reclaim time (target: visibility timeout + 1 s);
* ListQueues: latency of the first page (an empty request), three times;
* ``/metrics``: number of series (sample lines), and of ``dtq_queue_*`` series;
* Redis memory per drained queue (``used_memory`` delta while writing them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import redis.asyncio as aredis

from bench.common import REPO, private_redis, stop_process
from dtq_gateway.store import keys
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc

VT_S = 2.0
GROUP = "workers"


def _free_port() -> int:
    from tests.support.redis_server import free_port

    return free_port()


async def write_leftovers(r: aredis.Redis, n: int) -> int:
    """Write n drained queues; returns Redis used_memory growth (bytes)."""
    before = int((await r.info("memory"))["used_memory"])
    names = [f"drained{i:05d}" for i in range(n)]
    for start in range(0, n, 100):
        pipe = r.pipeline(transaction=False)
        for q in names[start:start + 100]:
            for band in range(9, -1, -1):
                stream = keys.stream(q, band)
                pipe.xgroup_create(stream, GROUP, id="0", mkstream=True)
                pipe.xgroup_createconsumer(stream, GROUP, "bench-worker-1")
        await pipe.execute()
    after = int((await r.info("memory"))["used_memory"])
    await r.zadd("dtq:queues", dict.fromkeys(names, 0))  # ignored by older code
    return after - before


def start_gateway(code: Path, redis_url: str, port: int, metrics_port: int) -> Any:
    env = {**os.environ, "PYTHONPATH": str(code), "DTQ_REDIS_URL": redis_url,
           "DTQ_LISTEN": f"127.0.0.1:{port}", "DTQ_METRICS_PORT": str(metrics_port),
           "DTQ_VISIBILITY_TIMEOUT_S": str(VT_S), "DTQ_HEARTBEAT_INTERVAL_S": "0.5",
           "DTQ_LOG_LEVEL": "WARNING", "DTQ_LOG_FORMAT": "text"}
    return subprocess.Popen([sys.executable, "-m", "dtq_gateway"], cwd=str(code), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


async def wait_ready(channel: grpc.aio.Channel, timeout_s: float = 60) -> None:
    await asyncio.wait_for(channel.channel_ready(), timeout_s)


async def idle_load(r: aredis.Redis, seconds: float) -> float:
    """Commands/s Redis processed over ``seconds`` (our two INFO calls excluded)."""
    before = int((await r.info("stats"))["total_commands_processed"])
    started = time.monotonic()
    await asyncio.sleep(seconds)
    after = int((await r.info("stats"))["total_commands_processed"])
    return (after - before - 1) / (time.monotonic() - started)


async def lost_lease_s(channel: grpc.aio.Channel, run: int) -> float:
    """Time from worker A's lease of a task to worker B's lease of the same task (a
    queue of its own per run, so earlier runs' tasks stay out of the way)."""
    broker = dtq_pb2_grpc.BrokerStub(channel)
    queue, a_id, b_id = f"live{run}", f"bench-a{run}", f"bench-b{run}"
    await broker.Enqueue(pb.EnqueueRequest(queue=queue, task_type="bench.t", payload=b"{}",
                                           max_attempts=3))
    a = broker.Lease(pb.LeaseRequest(worker_id=a_id, queues=[queue], max_in_flight=1,
                                     concurrency=1))
    assert (await a.read()).HasField("session")
    first = await asyncio.wait_for(a.read(), 30)
    leased_at = time.monotonic()
    b = broker.Lease(pb.LeaseRequest(worker_id=b_id, queues=[queue], max_in_flight=1,
                                     concurrency=1))
    assert (await b.read()).HasField("session")

    async def beat() -> None:
        while True:
            await broker.Heartbeat(pb.HeartbeatRequest(worker_id=b_id, concurrency=1))
            await asyncio.sleep(0.3)

    beating = asyncio.create_task(beat())
    try:
        again = await asyncio.wait_for(b.read(), 120)
        took = time.monotonic() - leased_at
    finally:
        beating.cancel()
        a.cancel()
        b.cancel()
    assert again.task.task_id == first.task.task_id and again.task.attempt == 2
    return took


async def list_queues_ms(channel: grpc.aio.Channel) -> list[float]:
    admin = dtq_pb2_grpc.AdminStub(channel)
    out = []
    for _ in range(3):
        started = time.perf_counter()
        reply = await admin.ListQueues(pb.ListQueuesRequest(), timeout=300)
        out.append((time.perf_counter() - started) * 1000)
        assert reply.queues
    return out


def metrics_series(port: int) -> tuple[int, int]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60).read()
    lines = [ln for ln in body.decode().splitlines() if ln and not ln.startswith("#")]
    return len(lines), sum(1 for ln in lines if ln.startswith("dtq_queue_"))


async def run(queues: int, code: Path, idle_s: float) -> dict[str, Any]:
    server = private_redis()
    proc = None
    r = aredis.Redis.from_url(server.url)
    try:
        memory = await write_leftovers(r, queues)
        port, metrics_port = _free_port(), _free_port()
        proc = start_gateway(code, server.url, port, metrics_port)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await wait_ready(channel)
            await asyncio.sleep(6)  # leadership, one-time backfill, first gauge refresh
            load = await idle_load(r, idle_s)
            lost = [await lost_lease_s(channel, i) for i in range(3)]
            listing = await list_queues_ms(channel)
            await asyncio.sleep(6)  # a gauge refresh after the lost-lease runs
            series, queue_series = metrics_series(metrics_port)
        return {"queues": queues, "code": str(code), "idle_commands_per_s": round(load, 1),
                "lost_lease_back_s": [round(x, 2) for x in lost],
                "list_queues_first_page_ms": [round(x, 1) for x in listing],
                "list_queues_median_ms": round(statistics.median(listing), 1),
                "metrics_series": series, "metrics_queue_series": queue_series,
                "redis_bytes_per_drained_queue": memory // max(1, queues)}
    finally:
        if proc is not None:
            stop_process(proc)
        await r.aclose()
        server.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.idle_queues", description=__doc__)
    parser.add_argument("--queues", type=int, default=5000, help="drained queues to leave")
    parser.add_argument("--code", type=Path, default=REPO,
                        help="tree whose dtq_gateway runs (default: this checkout)")
    parser.add_argument("--idle-s", type=float, default=10.0, help="idle load window (s)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args.queues, args.code.resolve(), args.idle_s))
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
