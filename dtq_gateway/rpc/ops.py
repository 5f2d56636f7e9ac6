"""Operations surface in one bundle: Admin and Events services, KEDA's external
scaler (:mod:`dtq_gateway.rpc.keda_scaler`), the shared events
hub, the queue-gauge refresher, the Prometheus endpoint and the interceptors.

Wiring in the gateway::

    server = grpc.aio.server(interceptors=server_interceptors(settings))
    ops = Operations(redis, settings)
    ops.add_to_server(server)
    ops.hub.add_listener(dispatcher.on_event)
    ops.listen()         # with the other listeners: the metrics endpoint
    ops.start()          # after the server started
    ...
    await ops.stop()     # right after draining starts: ends Subscribe streams
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import grpc

from dtq_gateway.duties.queue_gauges import QueueGaugeCollector
from dtq_gateway.events.events_hub import EventsHub
from dtq_gateway.listen import ListenError, reason_of
from dtq_gateway.metrics import start_metrics_server
from dtq_gateway.rpc import events_servicer, keda_scaler
from dtq_gateway.rpc.admin_servicer import AdminServicer
from dtq_gateway.rpc.auth import AuthInterceptor, parse_tokens
from dtq_gateway.rpc.decoding import DecodeGuardInterceptor
from dtq_gateway.rpc.events_servicer import EventsServicer
from dtq_gateway.rpc.limits import PeerLimitInterceptor
from dtq_gateway.rpc.metrics_interceptor import MetricsInterceptor
from dtq_gateway.settings import Settings
from dtq_gateway.store.client import Client
from dtq_proto import dtq_pb2_grpc

log = logging.getLogger(__name__)


def server_interceptors(settings: Settings) -> list[grpc.aio.ServerInterceptor]:
    """Interceptors in order: metrics first (so refused calls are measured), the
    per-peer call bound (before auth: unauthenticated floods count too), then auth when
    ``DTQ_AUTH_TOKENS`` is set, then the decode guard (a request that does not parse
    answers INVALID_ARGUMENT, after authentication decided)."""
    interceptors: list[grpc.aio.ServerInterceptor] = [
        MetricsInterceptor(), PeerLimitInterceptor(settings.max_streams_per_peer)]
    if settings.auth_tokens:
        interceptors.append(AuthInterceptor(parse_tokens(settings.auth_tokens)))
    interceptors.append(DecodeGuardInterceptor())
    return interceptors


class Operations:
    """Admin + Events services and their background parts.

    Args:
        redis: the gateway's client.
        settings: gateway settings (metrics port 0 = no HTTP endpoint).
        gauge_interval_s: period of the queue-gauge refresh (s).
        broker: the gateway's broker (Admin.TriggerSchedule enqueues through it).
    """

    def __init__(self, redis: Client, settings: Settings, *, gauge_interval_s: float = 5.0,
                 broker: Any = None) -> None:
        self.settings = settings
        self.hub = EventsHub(redis, max_subscribers=settings.events_max_subscribers,
                             max_deliveries_per_s=settings.events_max_deliveries_per_s,
                             **events_servicer.hub_options())
        self.admin = AdminServicer(redis, settings, broker)
        self.events = EventsServicer(self.hub)
        self.scaler = keda_scaler.KedaScaler(redis, self.hub)
        self.gauges = QueueGaugeCollector(redis, settings.heartbeat_interval_ms,
                                          interval_s=gauge_interval_s,
                                          max_queues=settings.metrics_max_queues)
        self._gauge_task: asyncio.Task[None] | None = None
        self._http: Any = None

    def add_to_server(self, server: grpc.aio.Server) -> None:
        """Register the Admin and Events services and KEDA's external scaler."""
        dtq_pb2_grpc.add_AdminServicer_to_server(self.admin, server)
        events_servicer.add_to_server(self.events, server)
        keda_scaler.add_to_server(self.scaler, server)

    def listen(self) -> None:
        """Start the metrics endpoint (DTQ_METRICS_PORT; nothing when it is 0).

        Raises:
            ListenError: the metrics address cannot be bound (``metrics cannot listen on
                HOST:PORT: <reason>``).
        """
        if not self.settings.metrics_port or self._http is not None:
            return
        host = self.settings.metrics_host or self.settings.listen.rpartition(":")[0]
        host = host.strip("[]")
        try:
            self._http = start_metrics_server(host, self.settings.metrics_port)
        except OSError as exc:
            shown = f"[{host}]" if ":" in host else host
            raise ListenError("metrics", f"{shown}:{self.settings.metrics_port}",
                              reason_of(exc)) from None

    def start(self) -> None:
        """Start the hub, the gauge refresher and the metrics endpoint (:meth:`listen`,
        when the gateway has not called it yet).

        Raises:
            ListenError: the metrics address cannot be bound.
        """
        self.listen()
        self.hub.start()
        self.start_gauges()

    def start_gauges(self) -> asyncio.Task[None]:
        """Start the queue-gauge refresher (again, after its task ended); returns it."""
        if self._gauge_task is None or self._gauge_task.done():
            self._gauge_task = asyncio.create_task(self.gauges.run(),
                                                   name="dtq-metrics-refresh")
        return self._gauge_task

    @property
    def metrics_port(self) -> int:
        """Bound port of the metrics endpoint (0 when disabled)."""
        return self._http[0].server_port if self._http else 0

    async def stop(self) -> None:
        """Stop the hub (Subscribe streams end with UNAVAILABLE), the refresher and
        the metrics endpoint."""
        await self.stop_background()
        await self.close_listener()

    async def stop_background(self) -> None:
        """Stop the hub (Subscribe streams end with UNAVAILABLE) and the refresher
        (waits up to 5 s for its tick, then cancels it)."""
        await self.hub.stop()
        self.gauges.stop()
        if self._gauge_task is not None:
            _, pending = await asyncio.wait({self._gauge_task}, timeout=5.0)
            for task in pending:
                task.cancel()
            self._gauge_task = None

    async def close_listener(self) -> None:
        """Stop the metrics endpoint (nothing when it was not started)."""
        if self._http is not None:
            server, _thread = self._http
            with contextlib.suppress(Exception):
                await asyncio.get_running_loop().run_in_executor(None, server.shutdown)
                server.server_close()
            self._http = None
