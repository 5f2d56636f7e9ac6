"""Auth and metrics interceptors on a real server; the Prometheus HTTP endpoint."""

from __future__ import annotations

import asyncio
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from dtq_gateway.metrics import start_metrics_server
from dtq_proto import dtq_pb2 as pb
from tests.support.leasing import error_reason, wait_until
from tests.support.ops_server import ops_server
from tests.support.redis_server import free_port

TOKENS = "adm-token-1=admin:ops-alice,prod-token-1=producer:app,work-token-1=worker:w1"


def bearer(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture
async def ops(redis_url: str):
    async with ops_server(redis_url, auth_tokens=TOKENS) as srv:
        yield srv


def rpc_count(method: str, code: str) -> float:
    return REGISTRY.get_sample_value("dtq_rpc_duration_seconds_count",
                                     {"method": method, "code": code}) or 0


async def rpc_count_reaches(method: str, code: str, count: float) -> float:
    """The count once it is at least ``count`` (the gateway observes a call after its
    answer went out, so the client may look first), within 5 s."""
    await wait_until(lambda: rpc_count(method, code) >= count)
    return rpc_count(method, code)


async def test_missing_and_unknown_tokens_are_unauthenticated(ops) -> None:
    before = rpc_count("/dtq.v1.Admin/ListQueues", "UNAUTHENTICATED")
    for metadata in ((), bearer("nope-nope-nope")):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await ops.admin.ListQueues(pb.ListQueuesRequest(), metadata=metadata)
        assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert error_reason(exc.value) == "UNAUTHENTICATED"
    assert await rpc_count_reaches("/dtq.v1.Admin/ListQueues", "UNAUTHENTICATED",
                                   before + 2) == before + 2


async def test_wrong_role_is_permission_denied_unary_and_stream(ops) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await ops.admin.ListQueues(pb.ListQueuesRequest(), metadata=bearer("prod-token-1"))
    assert (exc.value.code(), error_reason(exc.value)) == (
        grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED")
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        async for _ in ops.events.Subscribe(pb.SubscribeRequest(),
                                            metadata=bearer("work-token-1")):
            pass
    assert exc.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_admin_token_is_the_audit_actor(ops) -> None:
    before = rpc_count("/dtq.v1.Admin/PauseQueue", "OK")
    await ops.admin.PauseQueue(pb.PauseQueueRequest(queue="q1", create=True), metadata=bearer("adm-token-1"))
    entries = (await ops.admin.ListAudit(pb.ListAuditRequest(),
                                         metadata=bearer("adm-token-1"))).entries
    assert [(e.actor, e.action) for e in entries] == [("ops-alice", "pause_queue")]
    assert await rpc_count_reaches("/dtq.v1.Admin/PauseQueue", "OK", before + 1) == before + 1


async def test_health_is_open_without_token(ops) -> None:
    stub = health_pb2_grpc.HealthStub(ops.channel)
    reply = await stub.Check(health_pb2.HealthCheckRequest())
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_metrics_endpoint_serves_dtq_metrics() -> None:
    port = free_port()
    server, _thread = start_metrics_server("127.0.0.1", port)
    try:
        def fetch() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                return resp.read().decode()

        body = await asyncio.get_running_loop().run_in_executor(None, fetch)
    finally:
        server.shutdown()
        server.server_close()
    for name in ("dtq_tasks_enqueued_total", "dtq_lease_wait_seconds", "dtq_workers_live",
                 "dtq_rpc_duration_seconds", "dtq_queue_depth"):
        assert f"# TYPE {name}" in body
