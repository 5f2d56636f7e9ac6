"""Redis at maxmemory (noeviction): every refused write is an error to its caller.

A script is refused at its first write, so an EnqueueBatch chunk (one script call of
up to 100 tasks) is stored whole or not at all; items answer per chunk. The way out
(leasing, Ack, Fail... with allow-oom scripts on Redis >= 7.0) is
tests/grpc/test_redis_full_way_out.py; here its scripts without flags, as on Redis 6.2.
"""

from __future__ import annotations

from types import SimpleNamespace

import grpc
import pytest
import redis.asyncio as aioredis

from dtq_gateway.server import Gateway
from dtq_gateway.store import keys, scripts
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.conftest import gateway_settings
from tests.support.leasing import error_reason

PAYLOAD = b'{"pad":"' + b"x" * 900 + b'"}'


def enq(**kw) -> pb.EnqueueRequest:
    return pb.EnqueueRequest(queue="q", task_type="t", payload=PAYLOAD, **kw)


@pytest.fixture
async def full_env(own_redis):
    gw = Gateway(gateway_settings(own_redis.url), own_redis.url)
    await gw.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}")
    r = aioredis.Redis.from_url(own_redis.url)
    yield SimpleNamespace(stub=dtq_pb2_grpc.BrokerStub(channel), r=r, channel=channel)
    await r.config_set("maxmemory", 0)
    await channel.close()
    await gw.stop()
    await r.aclose()


async def _cap_memory(r: aioredis.Redis, headroom_bytes: int) -> None:
    used = int((await r.info("memory"))["used_memory"])
    await r.config_set("maxmemory", used + headroom_bytes)


async def test_batch_over_maxmemory_answers_per_chunk_and_stores_no_half_chunk(full_env):
    stub, r = full_env.stub, full_env.r
    await stub.Enqueue(pb.EnqueueRequest(queue="q", task_type="t", payload=b"{}"))  # groups
    # room for a few 100-task chunks of ~1 KB tasks. Batches of 300 items: a whole
    # pipeline sits in Redis's query buffer, which counts as used memory, so one batch
    # of thousands could be refused whole before its first chunk runs
    await _cap_memory(r, 600_000)
    stored: list[str] = []
    refused: list = []
    for _ in range(40):
        resp = await stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[enq() for _ in range(300)]))
        ok = [res.task_id for res in resp.results if res.task_id]
        assert len(ok) % 100 == 0, "a chunk is stored whole or not at all"
        stored += ok
        refused += [res.error for res in resp.results if not res.task_id]
        if refused:
            break
    assert stored and refused, f"the cap should stop the batches ({len(stored)} stored)"
    assert {(e.code, e.reason) for e in refused} == {
        (grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], "REDIS_OUT_OF_MEMORY")}
    assert await r.xlen(keys.stream("q", 5)) == len(stored) + 1
    await _cap_memory(r, -100_000)  # a single task is refused too while Redis is full
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Enqueue(enq())
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error_reason(err.value) == "REDIS_OUT_OF_MEMORY"
    await r.config_set("maxmemory", 0)  # memory freed: resending the refused items
    again = await stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[enq() for _ in refused]))
    assert all(res.task_id for res in again.results)
    assert await r.xlen(keys.stream("q", 5)) == 1 + len(stored) + len(refused)


async def test_without_script_flags_heartbeat_and_lease_report_a_full_redis(
        full_env, monkeypatch):
    """Redis 6.2 takes no script flags: there the way out is refused like any write
    (on Redis 7 the plain sources, which the gateway then sends, behave the same)."""
    monkeypatch.setattr(scripts, "_shebang_refused", True)
    stub, r = full_env.stub, full_env.r
    await stub.Heartbeat(pb.HeartbeatRequest(worker_id="w1"))
    await _cap_memory(r, -1_000_000)  # below what is used: every write is refused
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Heartbeat(pb.HeartbeatRequest(worker_id="w1"))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    call = stub.Lease(pb.LeaseRequest(worker_id="w2", queues=["q"], max_in_flight=1))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call.read()
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_without_script_flags_health_is_not_serving_while_redis_memory_is_full(
        full_env, monkeypatch):
    monkeypatch.setattr(scripts, "_shebang_refused", True)  # as on Redis 6.2
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from tests.support.leasing import poll

    r = full_env.r
    health = health_pb2_grpc.HealthStub(full_env.channel)

    async def status() -> int:
        return (await health.Check(health_pb2.HealthCheckRequest())).status

    assert await poll(status, lambda s: s == health_pb2.HealthCheckResponse.SERVING)
    await _cap_memory(r, -1_000_000)
    assert await poll(status, lambda s: s == health_pb2.HealthCheckResponse.NOT_SERVING)
    await r.config_set("maxmemory", 0)
    assert await poll(status, lambda s: s == health_pb2.HealthCheckResponse.SERVING)
