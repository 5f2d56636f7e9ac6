"""dtq scale figures: idle Lease streams, Redis memory per queued task, streams at rest.

Runs against the gateway that :mod:`bench.dtq_bench` started, after the throughput
figures, on queues of its own (``bench_scale``, ``bench_idle``, ``bench_mem``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import grpc
import redis.asyncio as aredis

from bench.common import latency_summary, proc_rss_bytes
from dtq_gateway.store import keys

logger = logging.getLogger(__name__)
IDLE_STREAMS = 1000
STREAMS_PER_CHANNEL = 100
#: Each idle-stream channel gets its own TCP connection: grpc Python shares one
#: connection among all channels to a target with the same options (its global
#: subchannel pool), so 1,000 streams over "ten channels" were 1,000 calls on ONE
#: connection, filling its DTQ_GRPC_MAX_CONCURRENT_STREAMS (1,000): the probe's Lease,
#: on that connection too, then waited in the client and never got SessionInfo.
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
PAYLOAD_100 = b'{"pad":"' + b"x" * 90 + b'"}'  # exactly 100 bytes of JSON


def _pb() -> tuple[Any, Any]:
    from dtq_proto import dtq_pb2, dtq_pb2_grpc

    return dtq_pb2, dtq_pb2_grpc


async def lease_latency(channel: grpc.aio.Channel, samples: int) -> dict[str, float]:
    """Enqueue → LeasedTask-received latency (ms), one task at a time, each acked.

    The clock starts before the Enqueue call, so the figure includes its round trip.
    """
    pb, grpc_mod = _pb()
    stub = grpc_mod.BrokerStub(channel)
    call = stub.Lease(pb.LeaseRequest(worker_id="bench-scale-probe", queues=["bench_scale"],
                                      max_in_flight=1, concurrency=1, sdk="dtq-bench"))
    stream = call.__aiter__()
    first = await stream.__anext__()
    assert first.HasField("session"), "Lease must open with SessionInfo"
    lat: list[float] = []
    try:
        for _ in range(samples):
            t0 = time.perf_counter()
            await stub.Enqueue(pb.EnqueueRequest(queue="bench_scale", task_type="noop",
                                                 payload=PAYLOAD_100))
            msg = await asyncio.wait_for(stream.__anext__(), timeout=10)
            lat.append((time.perf_counter() - t0) * 1000)
            await stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=msg.task.lease_id)]))
            await asyncio.sleep(0.005)
    finally:
        call.cancel()
    return latency_summary(lat)


async def open_idle_streams(target: str, n: int) -> tuple[list[Any], list[Any]]:
    """Open ``n`` Lease streams on an empty queue, STREAMS_PER_CHANNEL per channel and
    connection; return once each got its SessionInfo."""
    pb, grpc_mod = _pb()
    channels = [grpc.aio.insecure_channel(target, options=OWN_CONNECTION)
                for _ in range((n + STREAMS_PER_CHANNEL - 1) // STREAMS_PER_CHANNEL)]
    calls = []
    for i in range(n):
        stub = grpc_mod.BrokerStub(channels[i // STREAMS_PER_CHANNEL])
        calls.append(stub.Lease(pb.LeaseRequest(
            worker_id=f"bench-idle-{i}", queues=["bench_idle"], max_in_flight=1,
            concurrency=1, sdk="dtq-bench")))

    async def first(call: Any) -> None:
        msg = await call.read()
        assert msg.HasField("session"), "Lease must open with SessionInfo"
    await asyncio.wait_for(asyncio.gather(*(first(c) for c in calls)), timeout=120)
    return channels, calls


async def idle_streams_figures(procs: Any, channel: grpc.aio.Channel, r: aredis.Redis,
                               samples: int) -> dict[str, Any]:
    """Redis clients, gateway RSS and enqueue→lease latency before/after 1,000 idle streams."""
    pid = procs.gateway.pid
    before = await lease_latency(channel, samples)
    out: dict[str, Any] = {
        "scale_redis_clients_before": (await r.info("clients"))["connected_clients"],
        "scale_gateway_rss_mb_before": round(proc_rss_bytes(pid) / 2**20, 1),
        "scale_lease_p50_ms_before": before["p50_ms"],
        "scale_lease_p99_ms_before": before["p99_ms"]}
    channels, calls = await open_idle_streams(procs.target, IDLE_STREAMS)
    try:
        after = await lease_latency(channel, samples)
        out.update({
            "scale_idle_streams": IDLE_STREAMS,
            "scale_redis_clients_idle": (await r.info("clients"))["connected_clients"],
            "scale_gateway_rss_mb_idle": round(proc_rss_bytes(pid) / 2**20, 1),
            "scale_lease_p50_ms_idle": after["p50_ms"],
            "scale_lease_p99_ms_idle": after["p99_ms"]})
    finally:
        for call in calls:
            call.cancel()
        await asyncio.gather(*(c.close() for c in channels))
    return out


async def memory_per_task(channel: grpc.aio.Channel, r: aredis.Redis, n: int) -> dict[str, Any]:
    """Redis used_memory growth per queued 100-byte task (bytes) with ``n`` queued."""
    pb, grpc_mod = _pb()
    stub = grpc_mod.BrokerStub(channel)
    before = (await r.info("memory"))["used_memory"]
    item = pb.EnqueueRequest(queue="bench_mem", task_type="noop", payload=PAYLOAD_100)
    for i in range(0, n, 500):
        await stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[item] * min(500, n - i)))
    after = (await r.info("memory"))["used_memory"]
    return {"mem_queued_tasks": n, "mem_bytes_per_queued_task": round((after - before) / n, 1)}


async def streams_at_rest(r: aredis.Redis, through: int) -> dict[str, Any]:
    """Entries and PEL size left in queue ``bench``'s band streams after its tasks ran."""
    entries = pending = 0
    for name in keys.queue_streams_desc("bench"):
        if await r.exists(name):
            entries += await r.xlen(name)
            for group in await r.xinfo_groups(name):
                pending += group["pending"]
    return {"rest_tasks_through": through, "rest_stream_entries": entries,
            "rest_pel_entries": pending,
            "rest_dead_letter_entries": sum([await r.xlen(keys.dead_letter(q))
                                             for q in await r.smembers(keys.DEAD_LETTER_QUEUES)])}


async def run_scale(redis_url: str, sizes: Any, procs: Any, channel: grpc.aio.Channel,
                    through: int) -> dict[str, Any]:
    """All scale figures (memory last: it leaves its tasks queued)."""
    r = aredis.Redis.from_url(redis_url)
    try:
        out = await streams_at_rest(r, through)
        samples = 100 if sizes.backlog_n < 20000 else 300
        out.update(await idle_streams_figures(procs, channel, r, samples))
        mem_n = 100000 if sizes.backlog_n >= 20000 else min(10000, 4 * sizes.backlog_n)
        out.update(await memory_per_task(channel, r, mem_n))
        return out
    finally:
        await r.aclose()
