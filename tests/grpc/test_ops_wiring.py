"""The Operations bundle: services registered, gauges refreshed, metrics served, clean stop."""

from __future__ import annotations

import asyncio
import urllib.request

import grpc
import pytest
import redis.asyncio as aioredis

from dtq_gateway.rpc.ops import Operations, server_interceptors
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.conftest import gateway_settings
from tests.support.admin_seed import put_task
from tests.support.leasing import poll
from tests.support.redis_server import free_port


def fetch(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


async def test_operations_bundle(redis_url: str) -> None:
    settings = gateway_settings(redis_url, metrics_port=free_port(),
                                auth_tokens="admin-token-9=admin:root")
    redis = aioredis.from_url(redis_url)
    await put_task(redis, "wired", band=3)
    server = grpc.aio.server(interceptors=server_interceptors(settings))
    ops = Operations(redis, settings, gauge_interval_s=0.2)
    ops.add_to_server(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ops.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        admin = dtq_pb2_grpc.AdminStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await admin.ListQueues(pb.ListQueuesRequest())
        assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
        reply = await admin.ListQueues(pb.ListQueuesRequest(),
                                       metadata=(("authorization", "Bearer admin-token-9"),))
        assert [q.name for q in reply.queues] == ["wired"]
        loop = asyncio.get_running_loop()
        body = await poll(lambda: loop.run_in_executor(None, fetch, ops.metrics_port),
                          lambda text: 'dtq_queue_depth{band="3",queue="wired"} 1.0' in text)
        assert 'dtq_rpc_duration_seconds_count{code="UNAUTHENTICATED"' in body
        assert await asyncio.wait_for(ops.hub.connected.wait(), 5)
    finally:
        await channel.close()
        await ops.stop()
        await server.stop(0)
        await redis.aclose()
    assert not ops.hub.connected.is_set()


async def test_metrics_exposition_is_as_documented(redis_url: str) -> None:
    """docs/operations.md, Metrics: every series is a `dtq_` one with the documented
    labels or one of prometheus_client's process and Python series; no `*_created`."""
    from prometheus_client.parser import text_string_to_metric_families

    settings = gateway_settings(redis_url, metrics_port=free_port())
    redis = aioredis.from_url(redis_url)
    await put_task(redis, "shown", band=2)
    ops = Operations(redis, settings, gauge_interval_s=0.2)
    ops.start()
    try:
        loop = asyncio.get_running_loop()
        body = await poll(lambda: loop.run_in_executor(None, fetch, ops.metrics_port),
                          lambda text: 'queue="shown"' in text)
    finally:
        await ops.stop()
        await redis.aclose()
    documented = {"queue", "band", "method", "code", "limit", "reason", "policy", "task", "key"}
    python_labels = {"generation", "implementation", "major", "minor", "patchlevel",
                     "version"}
    names, runtime_series = set(), 0
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            names.add(sample.name)
            assert not sample.name.endswith("_created"), sample.name
            labels = set(sample.labels) - {"le"}
            if sample.name.startswith("dtq_"):
                assert labels <= documented, (sample.name, labels)
            else:
                runtime_series += 1
                assert sample.name.startswith(("process_", "python_gc_", "python_info")), \
                    sample.name
                assert labels <= python_labels, (sample.name, labels)
    assert "dtq_queue_depth" in names and "python_info" in names
    assert runtime_series == 16
