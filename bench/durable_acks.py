"""``python -m bench.durable_acks``: the cost of DTQ_REDIS_MIN_REPLICAS_ACK per task.

A private primary (configured as bench.common.private_redis) with one replica on the
same host, and one ``dtq-gateway`` process per setting (``--replicas-ack 0`` and 1,
the same Redis flushed in between). Per setting, from one client process:

- **enqueue**: ``--tasks`` unary Enqueue calls one after another (each waits for its
  WAIT when the setting is on): tasks/s and latency p50/p99 (ms);
- **batch**: the same number of tasks in EnqueueBatch calls of 500: tasks/s;
- **ack**: the tasks leased over one Lease stream and acked one unary Ack at a time:
  acks/s and Ack latency p50/p99 (ms).

Also the primary's CPU per task over the three phases (µs, ``INFO cpu``; 2 x
``--tasks`` tasks). Prints one JSON object (also written to ``--out`` when given). The replica is on the
same host, so the figures show what WAIT adds by itself: one replication round trip
on loopback; across hosts add the network round trip to the primary's replica.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import redis

from bench.common import REPO, latency_summary, private_redis
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.support.leasing import LeaseStream
from tests.support.redis_sentinel import wait_for
from tests.support.redis_server import RedisServer, free_port

BATCH = 500
PAYLOAD = b'{"n": 1, "pad": "' + b"x" * 80 + b'"}'


def start_gateway(url: str, replicas_ack: int, log: Path) -> tuple[subprocess.Popen, str]:
    """A gateway process on ``url`` with the setting; (process, target) once it serves."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), DTQ_REDIS_URL=url,
               DTQ_LISTEN=f"127.0.0.1:{port}", DTQ_METRICS_PORT="0", DTQ_LOG_LEVEL="WARNING",
               DTQ_REDIS_MIN_REPLICAS_ACK=str(replicas_ack))
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "dtq_gateway"], env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    target = f"127.0.0.1:{port}"
    channel = grpc.insecure_channel(target)
    try:
        grpc.channel_ready_future(channel).result(timeout=30)
    finally:
        channel.close()
    return proc, target


async def measure(target: str, tasks: int) -> dict[str, Any]:
    """The three phases (module docstring) against one gateway."""
    async with grpc.aio.insecure_channel(target) as ch:
        broker = dtq_pb2_grpc.BrokerStub(ch)
        lat: list[float] = []
        t0 = time.perf_counter()
        for _ in range(tasks):
            s = time.perf_counter()
            await broker.Enqueue(pb.EnqueueRequest(queue="d", task_type="t", payload=PAYLOAD))
            lat.append((time.perf_counter() - s) * 1000)
        enqueue_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(0, tasks, BATCH):
            await broker.EnqueueBatch(pb.EnqueueBatchRequest(items=[
                pb.EnqueueRequest(queue="b", task_type="t", payload=PAYLOAD)
                for _ in range(min(BATCH, tasks - i))]))
        batch_s = time.perf_counter() - t0
        # every task in one stream before the first ack: concurrency = tasks sizes the
        # stream's unread window for that (protocol.md 3.3)
        lease = await LeaseStream(broker, "bench", ["d"], max_in_flight=tasks,
                                  concurrency=tasks).open()
        leased = await lease.take(tasks, timeout_s=60)
        acks: list[float] = []
        t0 = time.perf_counter()
        for task in leased:
            s = time.perf_counter()
            await broker.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=task.lease_id)]))
            acks.append((time.perf_counter() - s) * 1000)
        ack_s = time.perf_counter() - t0
        lease.close()
    return {"enqueue_per_s": round(tasks / enqueue_s), "enqueue_latency": latency_summary(lat),
            "batch_per_s": round(tasks / batch_s), "ack_per_s": round(tasks / ack_s),
            "ack_latency": latency_summary(acks)}


def _redis_cpu_s(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def run(tasks: int, settings: list[int], work: Path) -> dict[str, Any]:
    """Every setting in turn on one primary + replica; results by setting."""
    primary = private_redis()
    replica = RedisServer(appendonly=False, extra_args=(
        "--replicaof", "127.0.0.1", str(primary.port))).start()
    r = redis.Redis(port=primary.port)
    out: dict[str, Any] = {"tasks": tasks, "replicas": 1}
    try:
        probe = redis.Redis(port=replica.port, socket_timeout=1)
        wait_for(lambda: probe.info("replication").get("master_link_status") == "up", 30,
                 "the replica link")
        probe.close()
        for n in settings:
            r.flushall()
            proc, target = start_gateway(primary.url, n, work / f"gateway-{n}.log")
            try:
                cpu = _redis_cpu_s(r)
                row = asyncio.run(measure(target, tasks))
                # every phase together: 2 x tasks enqueued, tasks leased and acked
                row["redis_cpu_us_per_task"] = round(
                    (_redis_cpu_s(r) - cpu) * 1e6 / (2 * tasks), 1)
                out[f"replicas_ack_{n}"] = row
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    finally:
        r.close()
        replica.cleanup()
        primary.cleanup()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.durable_acks", description=__doc__)
    p.add_argument("--tasks", type=int, default=2000, help="tasks per phase")
    p.add_argument("--replicas-ack", default="0,1",
                   help="DTQ_REDIS_MIN_REPLICAS_ACK values to compare (0 or 1)")
    p.add_argument("--out", default="", help="also write the JSON here")
    args = p.parse_args(argv)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"dtq-durable-bench-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    result = run(args.tasks, [int(v) for v in args.replicas_ack.split(",")], work)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
