"""The gateway's health probe: gRPC health from Redis's reachability, memory and
eviction policy, and the gateway's liveness key (a part of :mod:`dtq_gateway.server`,
kept apart for size)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from grpc_health.v1 import health, health_pb2

from dtq_gateway.metrics import REDIS_MEMORY_FULL
from dtq_gateway.store import health as redis_health
from dtq_gateway.store.client import Client
from dtq_gateway.store.redis_policy import EvictionPolicyWatch
from dtq_proto import dtq_pb2

log = logging.getLogger("dtq_gateway.server")

#: gRPC health service name that is NOT_SERVING while Enqueue is refused because Redis's
#: memory is full (the overall health stays SERVING then: see HealthProbe)
ENQUEUE_HEALTH = "dtq.enqueue"
#: The gateway's gRPC services, each with its own health status.
SERVICE_NAMES = tuple(dtq_pb2.DESCRIPTOR.services_by_name[n].full_name
                      for n in ("Broker", "Admin", "Events"))


class HealthProbe:
    """PINGs Redis every second; health is SERVING only while Redis answers, the
    gateway is not draining and (with DTQ_REQUIRE_NOEVICTION) Redis may not evict keys.

    A full Redis (``used_memory`` at ``maxmemory``) keeps health SERVING on Redis >= 7.0:
    leasing, Ack, Fail and the admin calls that free memory still work there (the
    ``allow_oom`` scripts, :mod:`dtq_gateway.store.scripts`), and a probe that turned
    NOT_SERVING would cut workers off from them. The reason is reported instead by the
    health service :data:`ENQUEUE_HEALTH` (NOT_SERVING while Enqueue is refused: memory
    full or an evicting policy refused), ``dtq_redis_memory_full`` and one WARNING. On a
    Redis that refused script flags (6.2) nothing works while full: health NOT_SERVING.
    Memory is read every ``memory_check_s`` (INFO memory), the eviction policy every
    ``policy.interval_s``. In cluster mode each of these covers every primary
    (:mod:`dtq_gateway.store.health`).

    The probe reads through ``probe_redis``, a client of its own: through the calls'
    pool, a burst of calls holding every connection made the PING wait past its
    deadline and a busy gateway reported Redis down (NOT_SERVING) while Redis answered.
    ``redis`` (the calls' client) only has its idle connections dropped when Redis
    answers again after an outage."""

    def __init__(self, redis: Client, servicer: health.aio.HealthServicer,
                 draining: asyncio.Event, policy: EvictionPolicyWatch,
                 interval_s: float = 1.0, memory_check_s: float = 2.0,
                 liveness_key: str = "", liveness_ttl_ms: int = 30_000,
                 probe_redis: Client | None = None,
                 background_ok: Callable[[], bool] = lambda: True) -> None:
        self.redis = redis
        #: False once the supervisor gave up on a background task: NOT_SERVING then
        self.background_ok = background_ok
        #: the probe's own client (None: the calls' client, as in unit tests)
        self.probe_redis = probe_redis or redis
        self.servicer = servicer
        self.draining = draining
        self.policy = policy
        self.interval_s = interval_s
        self.memory_check_s = memory_check_s
        #: dtq:gateway:<tag>, refreshed by every successful probe (ListWorkers counts a
        #: worker's Lease streams only on gateways whose key exists)
        self.liveness_key = liveness_key
        self.liveness_ttl_ms = liveness_ttl_ms
        #: the liveness key was written once: stop() deletes it
        self._liveness_written = False
        self.memory_full = False
        #: Redis takes script flags (>= 7.0: the way out of a full Redis); None = unread
        self.script_flags: bool | None = None
        self._memory_at = float("-inf")
        self._stopped = False
        self.redis_ok = False
        self._task: asyncio.Task | None = None

    async def _set(self, serving: bool, enqueue: bool | None = None) -> None:
        def status(up: bool) -> int:
            return (health_pb2.HealthCheckResponse.SERVING if up
                    else health_pb2.HealthCheckResponse.NOT_SERVING)

        for name in ("", *SERVICE_NAMES):
            await self.servicer.set(name, status(serving))
        await self.servicer.set(ENQUEUE_HEALTH, status(
            serving if enqueue is None else serving and enqueue))

    async def check_once(self) -> None:
        """Probe Redis once and publish the resulting status."""
        try:
            await asyncio.wait_for(redis_health.ping(self.probe_redis),
                                   timeout=self.interval_s * 2)
            ok = True
        except Exception:  # noqa: BLE001 - any failure means not serving
            ok = False
        if ok != self.redis_ok:
            log.log(logging.INFO if ok else logging.WARNING,
                    "redis reachable" if ok else "redis unreachable; health NOT_SERVING")
            if ok:  # connections pooled before an outage are dead: drop them first
                for client in {id(c): c for c in (self.redis, self.probe_redis)}.values():
                    with contextlib.suppress(Exception):
                        await redis_health.drop_idle_connections(client)
        self.redis_ok = ok
        if ok:
            try:
                if self.script_flags is None:  # once: Redis 6.2 takes no script flags
                    self.script_flags = await redis_health.detect_script_flags(
                        self.probe_redis)
                await self.policy.maybe_check()
                await self._check_memory()
            except Exception:  # Redis went away: keep the last known state
                log.debug("reading the eviction policy or memory failed", exc_info=True)
            if self.liveness_key:
                try:  # refused while Redis is full: the key then expires by its TTL
                    await asyncio.wait_for(redis_health.refresh_liveness(
                        self.probe_redis, self.liveness_key, self.liveness_ttl_ms),
                        timeout=self.interval_s * 2)
                    self._liveness_written = True
                except Exception:
                    log.debug("refreshing the gateway liveness key failed", exc_info=True)
        # a full Redis still serves the way out (Lease, Ack, Fail...) where scripts
        # take the allow-oom flag (Redis >= 7.0); Enqueue's own health says it is full
        way_out = redis_health.way_out_available()
        await self._set(ok and not self.draining.is_set() and not self.policy.refusing
                        and (way_out or not self.memory_full) and self.background_ok(),
                        enqueue=not self.memory_full)

    async def _check_memory(self) -> None:
        """Read used_memory / maxmemory (INFO memory) every ``memory_check_s``."""
        now = time.monotonic()
        if now - self._memory_at < self.memory_check_s:
            return
        self._memory_at = now
        memory = await redis_health.read_memory(self.probe_redis)
        full = memory.full
        if full != self.memory_full:
            if full:
                log.warning("redis memory is full (used_memory %s >= maxmemory %s): "
                            "Enqueue and other writes that add memory are refused with "
                            "REDIS_OUT_OF_MEMORY; leasing, Ack, Fail, cancel, resume, purge "
                            "and delete still work; health of %s NOT_SERVING",
                            memory.used_bytes, memory.max_bytes, ENQUEUE_HEALTH)
            else:
                log.info("redis memory is no longer full; health follows Redis again")
        self.memory_full = full
        REDIS_MEMORY_FULL.set(1 if full else 0)

    async def run(self) -> None:
        """Probe until :meth:`stop` (a flag as well as the cancel: Python 3.11's
        ``wait_for`` can swallow a cancel that lands as its inner call completes)."""
        while not self._stopped:
            await self.check_once()
            await asyncio.sleep(self.interval_s)

    def start(self) -> asyncio.Task[None]:
        """Start probing in the background (again, after the task ended); returns the
        task."""
        self._task = asyncio.create_task(self.run(), name="dtq-health")
        return self._task

    async def mark_not_serving(self) -> None:
        """Report NOT_SERVING for every service now (the supervisor gave up on a
        background task; :attr:`background_ok` keeps later probes from undoing it)."""
        await self._set(False)

    async def stop(self) -> None:
        """Stop probing and report NOT_SERVING.

        The wait for the cancelled probe is bounded: a Redis call cancelled while it
        waits for a pool connection can take long to unwind, and a stopping gateway must
        not wait for it (seen as a rare hang of Gateway.stop under load).
        """
        self._stopped = True
        if self._task:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=2.0)
        await self._set(False)
        if self.liveness_key and self._liveness_written:
            # a crashed replica's key expires by its TTL instead. The delete is left
            # behind after 1 s rather than awaited: redis-py can take a socket timeout
            # (5 s) to give up a connection attempt that was cancelled
            delete = asyncio.ensure_future(redis_health.delete_liveness(self.probe_redis,
                                                                        self.liveness_key))
            done, _ = await asyncio.wait({delete}, timeout=1.0)
            if not done:
                delete.cancel()
                log.debug("the gateway liveness key was not deleted in 1 s")
            elif delete.exception() is not None:
                log.debug("could not delete the gateway liveness key",
                          exc_info=delete.exception())
