"""The gateway process: gRPC server, Redis client, background duties, shutdown.

:class:`Gateway` wires the layers together. It can run in-process (tests start it
on ``127.0.0.1:0``) or from the CLI (``dtq-gateway``). :meth:`Gateway.start` binds every
listener (gRPC, metrics, dashboard) before it serves, and stops what it started when it
fails or is cancelled (ListenError names a listener that cannot bind): each start step
registers its stop step, and :meth:`Gateway.stop` runs them in reverse order. Shutdown
order on SIGTERM: health goes NOT_SERVING, Events and Lease streams end with
UNAVAILABLE so workers reconnect to another replica, the duties stop (the scheduler
lock is released at once), unary calls get ``shutdown_grace_s`` to finish, then
follow-ups finish and Redis connections close. Background tasks run under a
:class:`~dtq_gateway.supervisor.Supervisor` while the gateway serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from dtq_gateway import observe
from dtq_gateway.duties.followups import FollowUps, FollowUpSweep
from dtq_gateway.duties.scheduler import Scheduler
from dtq_gateway.health_probe import SERVICE_NAMES, HealthProbe
from dtq_gateway.leasing import leaseid
from dtq_gateway.leasing.completion import Completion, ItemOutcome
from dtq_gateway.leasing.dispatch import Dispatcher
from dtq_gateway.listen import ListenError, check_free
from dtq_gateway.rpc import auth
from dtq_gateway.rpc.broker_servicer import BrokerServicer
from dtq_gateway.rpc.ops import Operations, server_interceptors
from dtq_gateway.rpc.reflection_pool import ReflectionPool
from dtq_gateway.settings import Settings
from dtq_gateway.store import health as redis_health
from dtq_gateway.store.audit import request_id_of
from dtq_gateway.store.broker import Broker
from dtq_gateway.store.client import Client, make_client
from dtq_gateway.store.groups import Groups
from dtq_gateway.store.primary_watch import PrimaryWatch
from dtq_gateway.store.redis_policy import EvictionPolicyWatch
from dtq_gateway.supervisor import Starter, Supervisor, started_task
from dtq_gateway.web.dashboard import Dashboard
from dtq_gateway.web.dashboard_api import Backend
from dtq_gateway.web.dashboard_rates import RateTracker
from dtq_proto import dtq_pb2, dtq_pb2_grpc

log = logging.getLogger(__name__)

#: Seconds a stop may take beyond ``shutdown_grace_s`` (health, streams, duties and
#: connections closing); ``dtq-gateway`` exits 1 once grace + this margin has passed.
STOP_MARGIN_S = 5.0
GRPC_OPTIONS = [("grpc.max_receive_message_length", 64 << 20),
                ("grpc.max_send_message_length", 64 << 20)]


def grpc_options(settings: Settings) -> list[tuple[str, int]]:
    """Server channel options: GRPC_OPTIONS plus HTTP/2 keepalive from the settings.

    The gateway PINGs every connection every DTQ_GRPC_KEEPALIVE_TIME_MS, also when no
    call is open and no data flows (an idle Lease stream sends nothing), and closes a
    connection whose PING goes unanswered for DTQ_GRPC_KEEPALIVE_TIMEOUT_MS: a worker
    whose connection was black-holed (no FIN or RST ever arrives) loses its Lease
    stream then, instead of being sent leases that all expire unread. Clients may PING
    as often as every DTQ_GRPC_MIN_PING_INTERVAL_MS, with or without calls, so that
    workers can detect the same black hole from their side.

    Bounds: at most DTQ_GRPC_MAX_CONNECTIONS connections, DTQ_GRPC_MAX_CONCURRENT_STREAMS
    calls per connection (further calls wait in the client), DTQ_GRPC_MAX_PENDING_CALLS
    calls arrived but not yet handled (further ones are cancelled by grpc: CANCELLED),
    16 KiB of metadata per call, and a connection with no call open is closed after
    DTQ_GRPC_MAX_CONNECTION_IDLE_MS.
    """
    return [*GRPC_OPTIONS,
            # off, a taken port fails, not shared; on (DTQ_LISTEN_REUSEPORT: the processes
            # of DTQ_GATEWAY_PROCESSES) the kernel spreads connections over the sharers
            ("grpc.so_reuseport", int(settings.listen_reuseport)),
            ("grpc.keepalive_time_ms", settings.grpc_keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", settings.grpc_keepalive_timeout_ms),
            # grpc >= 1.5x waits for a PING ack this long (default 60 s), whatever
            # keepalive_timeout_ms says: both must be set for the timeout to hold
            ("grpc.http2.ping_timeout_ms", settings.grpc_keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),  # 0 = ping even when nothing flows
            ("grpc.http2.min_ping_interval_without_data_ms", settings.grpc_min_ping_interval_ms),
            # bounds on what clients can make the server hold (docs/security.md)
            ("grpc.max_allowed_incoming_connections", settings.grpc_max_connections),
            ("grpc.max_concurrent_streams", settings.grpc_max_concurrent_streams),
            # grpc counts a finished call against max_concurrent_streams until Python has
            # released it, so with this on (grpc's default) a client that keeps its calls
            # within the advertised limit still got RST_STREAM REFUSED_STREAM (UNAVAILABLE)
            # once it ran near 1000 calls on one connection: off, further calls wait in
            # the client as the limit says
            ("grpc.http.overload_protection", 0),
            # calls that arrived but that grpc.aio has not picked up yet: grpc's default
            # (1000, then random rejection up to 3000) cancelled calls (CANCELLED) of a
            # burst of 1600 over two connections; soft = hard: no random rejection
            ("grpc.server.max_pending_requests", settings.grpc_max_pending_calls),
            ("grpc.server.max_pending_requests_hard_limit", settings.grpc_max_pending_calls),
            ("grpc.max_connection_idle_ms", settings.grpc_max_connection_idle_ms or 2**31 - 1),
            ("grpc.max_metadata_size", 16 << 10)]


#: Connections of the health probe's own client (PING, INFO, CONFIG GET, the liveness
#: key): never shared with calls, so a busy pool is not mistaken for Redis being down.
PROBE_CONNECTIONS = 2


def redis_client(settings: Settings, url: str, max_connections: int = 0) -> Client:
    """The gateway's async Redis client for ``settings.redis_mode`` (standalone, cluster
    or Sentinel; built by :func:`dtq_gateway.store.client.make_client`), with
    ``max_connections`` (0 = DTQ_REDIS_MAX_CONNECTIONS)."""
    return make_client(settings.redis_mode, url,
                       max_connections=max_connections or settings.redis_max_connections,
                       sentinel_master=settings.redis_sentinel_master,
                       sentinel_password=settings.redis_sentinel_password)


class Gateway:
    """One gateway replica. ``await start()``, then ``await stop()``."""

    def __init__(self, settings: Settings, redis_url: str) -> None:
        self.settings = settings
        self.redis = redis_client(settings, redis_url)
        #: the health probe's own connections (HealthProbe)
        self.probe_redis = redis_client(settings, redis_url, max_connections=PROBE_CONNECTIONS)
        self.draining = asyncio.Event()
        #: stop steps of what started, run in reverse order by stop() (_on_stop)
        self._stack = contextlib.AsyncExitStack()
        self._on_stop("redis client", lambda: redis_health.close(self.redis))
        self._on_stop("health probe's redis client",
                      lambda: redis_health.close(self.probe_redis))
        #: watches the background tasks; giving up on one turns health NOT_SERVING
        self.supervisor = Supervisor(self._gave_up)
        self.groups = Groups(max_queues=settings.max_queues)
        #: the server's interceptors (ops.server_interceptors), in order
        self.interceptors = server_interceptors(settings)
        self.server = grpc.aio.server(options=grpc_options(settings),
                                      interceptors=self.interceptors)
        self.keyring = leaseid.Keyring(loader=lambda ring: leaseid.load_keyring(
            ring, self.redis, settings.lease_secret))
        self.completion = Completion(self.redis, settings, on_done=self._on_done,
                                     keyring=self.keyring)
        self.dispatcher = Dispatcher(self.redis, settings, self.groups, release=self._release,
                                     keyring=self.keyring)
        self.broker = Broker(self.redis, settings, self.groups, on_queued=self.dispatcher.notify,
                             read_ahead=self.dispatcher.read_ahead)
        self.health = health.aio.HealthServicer()
        self.policy = EvictionPolicyWatch(self.probe_redis, require=settings.require_noeviction,
                                          interval_s=settings.eviction_check_interval_s)
        #: sentinel mode: follows a primary switch at once (None in other modes)
        self.primary_watch = PrimaryWatch.of(self.redis, self.probe_redis)
        self.probe = HealthProbe(
            self.redis, self.health, self.draining, self.policy,
            liveness_key=redis_health.liveness_key(settings.gateway_id),
            liveness_ttl_ms=settings.worker_ttl_ms, probe_redis=self.probe_redis,
            background_ok=lambda: self.supervisor.healthy)
        self.ops = Operations(self.redis, settings, broker=self.broker)
        self.ops.hub.add_listener(self.dispatcher.on_event, self.dispatcher.wants_raw_event)
        self.scheduler = Scheduler(self.redis, settings, broker=self.broker)
        self.followups = FollowUps(self.redis, settings, self.broker)
        self.completion.on_follow = self.followups.after_outcome
        self.scheduler.add_duty(FollowUpSweep(self.followups, self.scheduler.lock,
                                              settings.followup_sweep_interval_s))
        self.dashboard = self._dashboard() if settings.dashboard_port else None
        self.port = 0
        self._stopped = False
        #: set by abort_start: a running start gives up at its next step
        self._abort = False

    def _dashboard(self) -> Dashboard:
        """The web dashboard (DTQ_DASHBOARD_PORT), counting throughput from the hub."""
        rates = RateTracker()
        self.ops.hub.add_listener(rates.on_event, rates.wants_raw)
        backend = Backend(self.redis, self.settings, self.broker, rates,
                          self.dispatcher.sessions)
        return Dashboard(backend, self.ops.hub, self.settings.dashboard_host,
                         self.settings.dashboard_port)

    def _on_done(self, worker_id: str, queue: str, outcome: ItemOutcome) -> None:
        self.dispatcher.credit_freed(worker_id)
        self.dispatcher.received(worker_id, (outcome.lease_id,))
        if outcome.status == "queued":
            self.dispatcher.notify(queue)
        observe.outcome(queue, outcome.kind, outcome.started_at_ms, outcome.finished_at_ms)

    async def _release(self, lease_ids: list[str]) -> None:
        items = [dtq_pb2.FailItem(lease_id=lid, mode=dtq_pb2.FAIL_MODE_RELEASE)
                 for lid in lease_ids]
        for i in range(0, len(items), 1000):
            await self.completion.fail(items[i:i + 1000])

    def _add_services(self) -> None:
        dtq_pb2_grpc.add_BrokerServicer_to_server(BrokerServicer(
            self.settings, self.broker, self.completion, self.dispatcher, self.draining,
            actor_of=auth.actor_of, request_id_of=request_id_of, admit=self.policy.admit,
            identity_of=auth.caller_identity, followups=self.followups),
            self.server)
        self.ops.add_to_server(self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME), self.server, pool=ReflectionPool())

    def _bind(self) -> int:
        """Bind the gRPC address (DTQ_LISTEN, with TLS when configured); return the port.

        Raises:
            ListenError: the address is taken or cannot be bound.
        """
        s = self.settings
        # grpc's own failure logs a C-core line first
        check_free("gRPC", s.listen, reuseport=s.listen_reuseport)
        try:
            if s.tls_cert:
                with open(s.tls_key, "rb") as fk, open(s.tls_cert, "rb") as fc:
                    pair = [(fk.read(), fc.read())]
                ca = None
                if s.tls_client_ca:
                    with open(s.tls_client_ca, "rb") as fca:
                        ca = fca.read()
                creds = grpc.ssl_server_credentials(pair, root_certificates=ca,
                                                    require_client_auth=bool(ca))
                port = self.server.add_secure_port(s.listen, creds)
            else:
                port = self.server.add_insecure_port(s.listen)
        except RuntimeError as exc:  # grpc's "Failed to bind": port taken or bad address
            raise ListenError("gRPC", s.listen, str(exc)) from None
        if not port:
            raise ListenError("gRPC", s.listen, "grpc bound no address")
        return port

    async def _listen(self) -> None:
        """Bind every listener before the gateway serves: gRPC, metrics, dashboard.

        Raises:
            ListenError: one of them cannot be bound.
        """
        self._add_services()
        self._on_stop("gRPC server", lambda: self.server.stop(self.settings.shutdown_grace_s))
        self.port = self._bind()
        self.ops.listen()
        self._on_stop("metrics endpoint", self.ops.close_listener)
        if self.dashboard is not None:
            await self.dashboard.start()
            self._on_stop("dashboard", self.dashboard.stop)

    async def start(self) -> None:
        """Start the gateway; on any failure (or cancellation) stop what was started.

        The start sequence: follow the Sentinel primary (Sentinel mode), read Redis's
        eviction policy and the lease secret (Redis may be down: both are read later
        then), bind every listener (gRPC, metrics, dashboard), serve, then start the
        scheduler, the dispatcher, the events hub and metrics refresh, and the health
        probe, each background task under :attr:`supervisor`. Each step registers how
        to stop what it started; a failure or a cancel (SIGTERM while starting) runs
        :meth:`stop`, which runs those steps in reverse order, so nothing is left
        listening or running.

        Raises:
            EvictionPolicyError: Redis may evict keys and DTQ_REQUIRE_NOEVICTION is on.
            ListenError: the gRPC, metrics or dashboard address cannot be bound.
            OSError: a TLS file cannot be read.
        """
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    def abort_start(self) -> None:
        """Make a running :meth:`start` give up at its next step (with the task's
        cancel: redis-py can turn a cancel that lands while it connects into a
        ConnectionError, which the start's Redis reads tolerate, and the start would
        then go on to its next Redis read and wait out a socket timeout)."""
        self._abort = True

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` has begun (also the one a failed start runs)."""
        return self._stopped

    def _step(self) -> None:
        """Raise CancelledError once :meth:`abort_start` or :meth:`stop` was called."""
        if self._abort or self._stopped:
            raise asyncio.CancelledError("gateway start aborted")

    def _on_stop(self, step: str, stop: Callable[[], Awaitable[object]]) -> None:
        """Register the stop step of what just started: :meth:`stop` runs the steps in
        reverse order; one that raises is logged (naming ``step``) and the later steps
        still run."""
        self._stack.push_async_callback(_guarded, step, stop)

    def _supervise(self, name: str, start: Starter,
                   stop: Callable[[], Awaitable[object]]) -> None:
        """Start a background task under the supervisor; ``stop`` ends it at stop."""
        self.supervisor.watch(name, start)
        self._on_stop(name, stop)

    async def _gave_up(self, task: str, why: str) -> None:
        """The supervisor gave up on a background task: NOT_SERVING for every service."""
        if not self._stopped:
            await self.probe.mark_not_serving()

    async def _start(self) -> None:
        if self.primary_watch is not None:
            self._supervise("primary-watch", self.primary_watch.start, self.primary_watch.stop)
        try:
            await self.policy.check(at_startup=True)
        except Exception:  # Redis down: the health probe reads it once Redis answers
            log.debug("eviction policy not read at startup", exc_info=True)
        self._step()
        try:
            await self.keyring.ensure()
        except Exception:  # Redis down: loaded at the first lease or Ack instead
            log.debug("lease secret not loaded at startup", exc_info=True)
        self._step()
        refused = self.policy.startup_error()
        if refused is not None:
            raise refused
        # follow-ups spawned by Acks during the server's grace finish after it
        self._on_stop("follow-ups", self.followups.drain)
        await self._listen()
        self._step()
        self._on_stop("health", self.probe.stop)  # the probe writes the liveness key
        await self.probe.check_once()
        self._step()
        await self.server.start()
        self._supervise("scheduler", self.scheduler.start, self.scheduler.stop)
        self._supervise("dispatcher", lambda: started_task(self.dispatcher.start),
                        self.dispatcher.stop)
        self._on_stop("events hub and metrics refresh", self.ops.stop_background)
        self.supervisor.watch("events-hub", self.ops.hub.start)
        self.supervisor.watch("metrics-refresh", self.ops.start_gauges)
        self.supervisor.watch("health", self.probe.start)
        log.info("listening", extra={"listen": self.settings.listen, "port": self.port,
                                     "gateway_id": self.settings.gateway_id})

    async def stop(self) -> None:
        """Drain: NOT_SERVING, end Events and Lease streams, stop the duties, let unary
        calls finish, close.

        The supervisor stops first (no task is restarted meanwhile) and health turns
        NOT_SERVING; then the stop steps of whatever :meth:`start` started run in
        reverse order: the events hub (Subscribe streams end with UNAVAILABLE) and
        metrics refresh, the dispatcher (Lease streams end with UNAVAILABLE), the
        scheduler (the leader lock is released), the health probe (the liveness key is
        deleted), the dashboard and metrics endpoint, the gRPC server (unary calls get
        ``shutdown_grace_s``), pending follow-ups, the Sentinel watch, the Redis
        connections. A step that raises is logged and the later steps still run.

        Safe on a gateway that started only in part (a failed or cancelled
        :meth:`start`) and safe to call again (later calls return at once). The waits
        for background tasks are bounded, the gRPC server's by ``shutdown_grace_s``;
        ``dtq-gateway`` cuts the whole stop at ``shutdown_grace_s`` + STOP_MARGIN_S.
        """
        if self._stopped:
            return
        self._stopped = True
        started = time.monotonic()
        self.draining.set()
        self.supervisor.close()
        await _guarded("health NOT_SERVING", self.probe.mark_not_serving)
        await self._stack.aclose()
        log.info("stopped", extra={"drain_s": round(time.monotonic() - started, 3)})


async def _guarded(step: str, stop: Callable[[], Awaitable[object]]) -> None:
    """Run one stop step; an exception is logged, naming the step, not raised."""
    try:
        await stop()
    except Exception:
        log.exception("stop step failed: %s", step, extra={"step": step})
