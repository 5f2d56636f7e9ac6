"""Events fan-out cost: a drain while N ``Events.Subscribe`` clients listen.

``python -m bench.events_fanout`` starts a private redis-server and a gateway, opens N
subscribers in a child process (a third read every event as it comes, a third read
one event per 50 ms, a third never read), enqueues a backlog of no-op tasks with
EnqueueBatch and drains it with one raw-stub worker in this process. Per case it
prints the drain time, the gateway's CPU, the worker's Heartbeat and Ack latencies,
the Ack items refused as stale, the leases reclaimed (a lease of attempt > 1) and the
tasks leased more than once. ``--src DIR`` runs the gateway from another checkout
(e.g. the code before a change), with the same client side.

Leases are short on purpose (visibility timeout 4 s, heartbeat 1 s, the worker beats
every 0.25 s): a gateway that answers a heartbeat or an Ack seconds late shows up as
reclaimed leases and stale acks within a run of a few seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc

from bench.common import REPO, latency_summary, private_redis, proc_cpu_s, stop_process
from tests.support.redis_server import free_port

QUEUE = "fanout"
VISIBILITY_TIMEOUT_S = 4
HEARTBEAT_INTERVAL_S = 1
BEAT_EVERY_S = 0.25
SLOW_READ_S = 0.05
STREAMS_PER_CHANNEL = 20
SETTLE_S = 2.0


def _pb() -> tuple[Any, Any]:
    from dtq_proto import dtq_pb2, dtq_pb2_grpc

    return dtq_pb2, dtq_pb2_grpc


# -- subscribers (child process) -------------------------------------------------------
async def _subscribers(target: str, n: int) -> None:
    """Open ``n`` Subscribe streams (fast / slow / never-reading thirds) until SIGTERM;
    print ``ready`` once all are open and a JSON summary when stopped."""
    pb, pbg = _pb()
    channels = [grpc.aio.insecure_channel(target, options=[("dtq.bench.channel", i)])
                for i in range(max(1, -(-n // STREAMS_PER_CHANNEL)))]
    stats: Counter[str] = Counter()

    async def read(call: Any, delay_s: float, kind: str) -> None:
        try:
            async for msg in call:
                stats[kind + "_events"] += 1
                stats[kind + "_dropped"] += msg.dropped
                if delay_s:
                    await asyncio.sleep(delay_s)
        except grpc.aio.AioRpcError as exc:
            stats["ended_" + exc.code().name] += 1

    calls, readers = [], []
    for i in range(n):
        call = pbg.EventsStub(channels[i % len(channels)]).Subscribe(pb.SubscribeRequest())
        calls.append(call)
        kind = ("fast", "slow", "never")[i % 3]
        if kind != "never":
            readers.append(asyncio.create_task(read(call, SLOW_READ_S if kind == "slow" else 0,
                                                    kind)))
    for ch in channels:
        await asyncio.wait_for(ch.channel_ready(), 10)
    # A Subscribe stream sends nothing before its first event, so the client cannot see
    # when the gateway registered it: a settle time (pacing, in a bench) covers that.
    await asyncio.sleep(SETTLE_S)
    print("ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(15, stop.set)
    await stop.wait()
    for call in calls:
        call.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    print(json.dumps(dict(stats)), flush=True)


# -- worker (this process) -------------------------------------------------------------
class Worker:
    """Leases from ``QUEUE``, acks every lease at once (no-op handler), heartbeats its
    in-flight leases every ``BEAT_EVERY_S``, and records what happened."""

    def __init__(self, stub: Any, pb: Any, total: int) -> None:
        self.stub, self.pb, self.total = stub, pb, total
        self.leased: Counter[str] = Counter()
        self.in_flight: dict[str, str] = {}
        self.pending: list[str] = []
        self.done: set[str] = set()
        self.acked: set[str] = set()  # lease ids acked OK
        self.lost_ids: set[str] = set()
        self.reclaimed = self.stale_acks = 0
        self.ack_ms: list[float] = []
        self.beat_ms: list[float] = []
        self._wake = asyncio.Event()
        self.finished = asyncio.Event()
        self.first_lease = self.last_ack = 0.0

    async def _read(self, call: Any) -> None:
        async for msg in call:
            if not msg.HasField("task"):
                continue
            task = msg.task
            self.first_lease = self.first_lease or time.perf_counter()
            self.leased[task.task_id] += 1
            self.reclaimed += task.attempt > 1
            self.in_flight[task.lease_id] = task.task_id
            self.pending.append(task.lease_id)
            self._wake.set()

    async def _ack(self) -> None:
        while len(self.done) < self.total:
            await self._wake.wait()
            self._wake.clear()
            batch, self.pending = self.pending, []
            if not batch:
                continue
            t0 = time.perf_counter()
            reply = await self.stub.Ack(self.pb.AckRequest(
                items=[self.pb.AckItem(lease_id=lid) for lid in batch]))
            self.ack_ms.append((time.perf_counter() - t0) * 1000)
            for lid, result in zip(batch, reply.results):
                task_id = self.in_flight.pop(lid, "")
                if result.HasField("error"):
                    self.stale_acks += 1
                elif not result.duplicate:
                    self.done.add(task_id)
                    self.acked.add(lid)
        self.last_ack = time.perf_counter()
        self.finished.set()

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(BEAT_EVERY_S)
            t0 = time.perf_counter()
            reply = await self.stub.Heartbeat(self.pb.HeartbeatRequest(
                worker_id="bench-fanout", lease_ids=list(self.in_flight)))
            self.beat_ms.append((time.perf_counter() - t0) * 1000)
            self.lost_ids.update(reply.lost_lease_ids)

    async def run(self, timeout_s: float) -> None:
        """Drain until every task was acked once, or ``timeout_s`` passed."""
        call = self.stub.Lease(self.pb.LeaseRequest(
            worker_id="bench-fanout", queues=[QUEUE], max_in_flight=64, hostname="bench"))
        tasks = [asyncio.create_task(c) for c in (self._read(call), self._ack(), self._beat())]
        try:
            await asyncio.wait_for(self.finished.wait(), timeout_s)
        finally:
            call.cancel()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def figures(self) -> dict[str, Any]:
        """The worker's side of the case."""
        return {"drain_s": round(self.last_ack - self.first_lease, 2) if self.last_ack else None,
                "acked": len(self.done), "stale_acks": self.stale_acks,
                "reclaimed": self.reclaimed, # a lease acked while its beat was under way is reported lost: not counted
                "lost_in_heartbeat": len(self.lost_ids - self.acked),
                "leased_twice": sum(1 for c in self.leased.values() if c > 1),
                "heartbeat_ms": latency_summary(self.beat_ms),
                "ack_ms": latency_summary(self.ack_ms)}


# -- one case ---------------------------------------------------------------------------
def _spawn(cmd: list[str], src: Path, env: dict[str, str], **kw: Any) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=src, env=dict(os.environ, PYTHONPATH=str(src), **env),
                            start_new_session=True, **kw)


async def _enqueue(stub: Any, pb: Any, n: int) -> None:
    items = [pb.EnqueueRequest(queue=QUEUE, task_type="noop", payload=b"{}") for _ in range(n)]
    for i in range(0, n, 500):
        reply = await stub.EnqueueBatch(pb.EnqueueBatchRequest(items=items[i:i + 500]))
        if any(r.HasField("error") for r in reply.results):
            raise RuntimeError("EnqueueBatch item failed")


async def run_case(src: Path, subscribers: int, tasks: int, timeout_s: float) -> dict[str, Any]:
    """One drain of ``tasks`` no-op tasks with ``subscribers`` Subscribe clients."""
    pb, pbg = _pb()
    server = private_redis()
    target = f"127.0.0.1:{free_port()}"
    gateway = _spawn([sys.executable, "-m", "dtq_gateway", "--redis-url", server.url,
                      "--listen", target, "--metrics-port", "0", "--log-level", "WARNING"], src,
                     {"DTQ_VISIBILITY_TIMEOUT_S": str(VISIBILITY_TIMEOUT_S),
                      "DTQ_HEARTBEAT_INTERVAL_S": str(HEARTBEAT_INTERVAL_S)})
    subs: subprocess.Popen | None = None
    channel = grpc.aio.insecure_channel(target)
    try:
        await asyncio.wait_for(channel.channel_ready(), 30)
        stub = pbg.BrokerStub(channel)
        if subscribers:
            subs = _spawn([sys.executable, "-m", "bench.events_fanout", "--subscriber-child",
                           str(subscribers), "--target", target], REPO, {},
                          stdout=subprocess.PIPE, text=True)
            line = await asyncio.to_thread(subs.stdout.readline)  # type: ignore[union-attr]
            if line.strip() != "ready":
                raise RuntimeError(f"subscribers did not start: {line!r}")
        cpu0 = proc_cpu_s(gateway.pid)
        t0 = time.perf_counter()
        await _enqueue(stub, pb, tasks)
        enqueue_s = time.perf_counter() - t0
        worker = Worker(stub, pb, tasks)
        try:
            await worker.run(timeout_s)
        except TimeoutError:
            pass
        out = {"subscribers": subscribers, "tasks": tasks, "enqueue_s": round(enqueue_s, 2),
               **worker.figures(),
               "gateway_cpu_s": round(proc_cpu_s(gateway.pid) - cpu0, 2)}
        if subs is not None:
            stop_process(subs)
            last = (subs.stdout.read() or "").strip().splitlines()  # type: ignore[union-attr]
            out["subscriber_side"] = json.loads(last[-1]) if last else {}
        return out
    finally:
        await channel.close()
        if subs is not None:
            stop_process(subs)
        stop_process(gateway)
        server.cleanup()


def main(argv: list[str] | None = None) -> None:
    """CLI entry point."""
    parser = argparse.ArgumentParser(prog="python -m bench.events_fanout")
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--subscribers", default="0,200",
                        help="comma-separated subscriber counts, one case each")
    parser.add_argument("--src", type=Path, default=REPO,
                        help="checkout whose dtq_gateway runs the gateway")
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--subscriber-child", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--target", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.subscriber_child:
        asyncio.run(_subscribers(args.target, args.subscriber_child))
        return
    for n in (int(x) for x in args.subscribers.split(",")):
        result = asyncio.run(run_case(args.src.resolve(), n, args.tasks, args.timeout_s))
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
