"""A small in-process gRPC server with the operations services (Admin, Events, health).

Used by the tests of the Admin/Events servicers and the interceptors, independent
of the full gateway wiring.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import redis.asyncio as aioredis
from grpc_health.v1 import health, health_pb2_grpc

from dtq_gateway.events.events_hub import EventsHub
from dtq_gateway.rpc.admin_servicer import AdminServicer
from dtq_gateway.rpc.auth import AuthInterceptor, parse_tokens
from dtq_gateway.rpc.events_servicer import EventsServicer, hub_options
from dtq_gateway.rpc.events_servicer import add_to_server as add_events_to_server
from dtq_gateway.rpc.metrics_interceptor import MetricsInterceptor
from dtq_proto import dtq_pb2_grpc


class OpsServer:
    """Handles of a running test server."""

    def __init__(self, port: int, channel: grpc.aio.Channel, hub: EventsHub,
                 redis: aioredis.Redis) -> None:
        self.port = port
        self.channel = channel
        self.hub = hub
        self.redis = redis
        self.admin = dtq_pb2_grpc.AdminStub(channel)
        self.events = dtq_pb2_grpc.EventsStub(channel)


@asynccontextmanager
async def ops_server(redis_url: str, auth_tokens: str = "", heartbeat_interval_s: float = 0.5,
                     **hub_kwargs: Any) -> AsyncIterator[OpsServer]:
    """Start Admin + Events + health on 127.0.0.1:<free port> (auth when tokens given);
    ``hub_kwargs`` go to the EventsHub (e.g. ``max_subscribers``)."""
    from tests.conftest import gateway_settings

    settings = gateway_settings(redis_url, heartbeat_interval_s=heartbeat_interval_s)
    redis = aioredis.from_url(redis_url)
    interceptors: list[grpc.aio.ServerInterceptor] = [MetricsInterceptor()]
    if auth_tokens:
        interceptors.append(AuthInterceptor(parse_tokens(auth_tokens)))
    server = grpc.aio.server(interceptors=interceptors)
    hub = EventsHub(redis, **hub_options(), **hub_kwargs)
    dtq_pb2_grpc.add_AdminServicer_to_server(AdminServicer(redis, settings), server)
    add_events_to_server(EventsServicer(hub), server)
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    hub.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield OpsServer(port, channel, hub, redis)
    finally:
        await channel.close()
        await hub.stop()
        await server.stop(0)
        await redis.aclose()
