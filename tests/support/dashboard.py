"""A gateway with its web dashboard on a free port, and real tasks to show on it.

Everything is made through the public gRPC API (Enqueue, Lease, Ack, Fail), so the
dashboard tests read what a real deployment would hold.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc

from dtq_proto import dtq_pb2, dtq_pb2_grpc
from tests.support.leasing import LeaseStream

#: A payload written to look like markup: the dashboard must show it as text.
XSS = "<img src=x onerror=\"window.__xss=1\"><script>window.__xss=2</script>"


class DashboardGateway:
    """Handles of a running gateway with its dashboard."""

    def __init__(self, gateway: Any, channel: grpc.aio.Channel) -> None:
        self.gateway = gateway
        self.channel = channel
        self.broker = dtq_pb2_grpc.BrokerStub(channel)
        self.admin = dtq_pb2_grpc.AdminStub(channel)

    @property
    def url(self) -> str:
        """Base URL of the dashboard (no trailing slash)."""
        return f"http://127.0.0.1:{self.gateway.dashboard.port}"

    async def enqueue(self, queue: str, task_type: str, payload: Any, **kw: Any) -> str:
        """Enqueue a JSON payload; returns the task id."""
        reply = await self.broker.Enqueue(dtq_pb2.EnqueueRequest(
            queue=queue, task_type=task_type, payload=json.dumps(payload).encode(), **kw))
        return reply.task_id

    async def dead_letter(self, queue: str, task_type: str, payload: Any, error: str,
                          error_class: str = "ValueError", worker_id: str = "w-dlq") -> str:
        """Enqueue a task with one attempt, lease it and fail it for good: it is then
        dead-lettered. Returns its id."""
        task_id = await self.enqueue(queue, task_type, payload, max_attempts=1)
        stream = await LeaseStream(self.broker, worker_id, [queue]).open()
        try:
            task = await stream.next()
            assert task.task_id == task_id
            await self.broker.Fail(dtq_pb2.FailRequest(items=[dtq_pb2.FailItem(
                lease_id=task.lease_id, error_message=error, error_class=error_class,
                retryable=False)]))
        finally:
            stream.close()
        return task_id

    async def succeed(self, queue: str, task_type: str, payload: Any, result: Any,
                      worker_id: str = "w-ok") -> str:
        """Enqueue a task, lease it and ack it with a JSON result. Returns its id."""
        task_id = await self.enqueue(queue, task_type, payload)
        stream = await LeaseStream(self.broker, worker_id, [queue]).open()
        try:
            task = await stream.next()
            await self.broker.Ack(dtq_pb2.AckRequest(items=[dtq_pb2.AckItem(
                lease_id=task.lease_id, result=json.dumps(result).encode())]))
        finally:
            stream.close()
        return task_id


@asynccontextmanager
async def dashboard_gateway(redis_url: str, **overrides: Any) -> AsyncIterator[DashboardGateway]:
    """An in-process gateway with the dashboard on 127.0.0.1:<free port>.

    ``overrides`` are settings (``auth_tokens=...``). With tokens, the gRPC channel
    sends the first admin token found in them.
    """
    from dtq_gateway.server import Gateway
    from tests.conftest import gateway_settings

    settings = gateway_settings(redis_url, dashboard_port=1, **overrides)
    gw = Gateway(settings, redis_url)
    gw.dashboard.requested_port = 0  # a free port, read back after start
    await gw.start()
    interceptors = []
    token = _admin_token(settings.auth_tokens)
    if token:  # grpc.aio files an interceptor under one call kind only
        interceptors += [_BearerUnary(token), _BearerStream(token)]
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}", interceptors=interceptors)
    try:
        yield DashboardGateway(gw, channel)
    finally:
        await channel.close()
        await gw.stop()


def _admin_token(spec: str) -> str:
    for item in spec.split(","):
        token, _, rest = item.strip().rpartition("=")
        if rest.startswith("admin:"):
            return token
    return ""


class _Bearer:
    """Adds ``authorization: Bearer <token>`` to every call."""

    def __init__(self, token: str) -> None:
        self.token = token

    def _details(self, details: Any) -> Any:
        metadata = list(details.metadata or []) + [("authorization", f"Bearer {self.token}")]
        return details._replace(metadata=metadata)


class _BearerUnary(_Bearer, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


class _BearerStream(_Bearer, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)
