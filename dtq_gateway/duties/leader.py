"""Scheduler leader election over ``dtq:lock:scheduler``.

One gateway replica at a time is the scheduler leader. It takes the lock with
``SET NX PX <ttl>`` and a value of its gateway id plus a random token, refreshes it
every ~3 s with a compare-and-set script (PEXPIRE only while the value is still
its token) and deletes it compare-and-delete on a graceful stop. Followers try to
take the lock every 1-2 s (jittered), so a new leader appears within the lock TTL
after the old one dies, and within ~2 s after it stops gracefully.

Leadership is also bounded locally: a leader that could not refresh (Redis
unreachable) considers itself a follower once ``ttl - margin`` has passed since its
last successful refresh began, i.e. before the lock can expire and pass to someone
else. A refresh that finds another value stops leadership at once. Every move of a
due task re-checks the token inside its script anyway, so even two replicas that
both believe they lead can never move a task twice.

The gauge ``dtq_scheduler_leader`` says whether this replica leads: :class:`LockKeeper`
sets it after every tick (a failed one too, so a leadership that lapsed during a Redis
outage reads 0) and to 0 when it stops.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

from dtq_gateway.duties.duty import PeriodicDuty, jittered
from dtq_gateway.metrics import SCHEDULER_LEADER
from dtq_gateway.store import leader_lock
from dtq_gateway.store.client import Client

log = logging.getLogger(__name__)


class LeaderLock:
    """The scheduler lock as seen by one replica (token, local validity).

    Args:
        redis: client.
        gateway_id: identity of this replica (prefix of the lock value).
        ttl_ms: lock TTL (ms); the seed's default is 10000.
    """

    def __init__(self, redis: Client, gateway_id: str, ttl_ms: int = 10_000) -> None:
        self._redis = redis
        self._gateway_id = gateway_id
        self.ttl_ms = ttl_ms
        #: Local safety margin (s): leadership ends this long before the lock could expire.
        self.margin_s = min(2.0, ttl_ms / 1000 / 5)
        self._token: str | None = None
        self._valid_until = 0.0  # time.monotonic() deadline of local leadership

    @property
    def token(self) -> str | None:
        """The lock value while leading, else None."""
        return self._token if self.is_leader else None

    @property
    def is_leader(self) -> bool:
        """True while this replica holds the lock and its local validity lasts."""
        return self._token is not None and time.monotonic() < self._valid_until

    def _extend(self, started: float) -> None:
        self._valid_until = started + self.ttl_ms / 1000 - self.margin_s

    def lose(self, why: str) -> None:
        """Stop leading now (refresh refused, or a script reported a foreign lock)."""
        if self._token is not None:
            log.warning("scheduler leadership lost: %s", why,
                        extra={"gateway_id": self._gateway_id})
        self._token = None
        self._valid_until = 0.0

    async def acquire(self) -> bool:
        """Try ``SET NX PX``; True when this replica is (now) the leader."""
        if self.is_leader:
            return True
        if self._token is not None:
            # Leadership lapsed locally (refreshes failed); if Redis still holds our
            # token nobody else led meanwhile, so keep the lock rather than wait out its TTL.
            started = time.monotonic()
            if await leader_lock.refresh(self._redis, self._token, self.ttl_ms):
                self._extend(started)
                return True
            self.lose("lock not refreshed within its TTL")
        token = f"{self._gateway_id}:{uuid.uuid4().hex[:16]}"
        started = time.monotonic()
        if await leader_lock.take(self._redis, token, self.ttl_ms):
            self._token = token
            self._extend(started)
            log.info("scheduler leadership acquired", extra={"gateway_id": self._gateway_id})
            return True
        self._token = None
        return False

    async def refresh(self) -> bool:
        """Compare-and-set PEXPIRE; on refusal leadership ends at once.

        Raises:
            store.errors.OUTAGE_ERRORS: Redis unreachable (leadership then lapses by
            itself at the local deadline).
        """
        token = self._token
        if token is None:
            return False
        if not self.is_leader:
            self.lose("lock not refreshed within its TTL")
            return False
        started = time.monotonic()
        ok = await leader_lock.refresh(self._redis, token, self.ttl_ms)
        if ok and self._token == token:
            self._extend(started)
            return True
        self.lose("lock held by another replica or expired")
        return False

    async def release(self) -> bool:
        """Compare-and-delete the lock if this replica holds it; True when deleted."""
        token, self._token, self._valid_until = self._token, None, 0.0
        if token is None:
            return False
        deleted = await leader_lock.release(self._redis, token)
        if deleted:
            log.info("scheduler leadership released", extra={"gateway_id": self._gateway_id})
        return deleted


class LockKeeper(PeriodicDuty):
    """Keeps or seeks leadership: refresh every ~3 s as leader, acquire every 1-2 s else.

    Args:
        lock: the replica's lock.
        refresh_interval_s: refresh period while leading (s).
        acquire_interval_s: mean retry period of followers (s); jittered ±33 %.
        on_acquired: called (synchronously) when leadership starts.
    """

    name = "scheduler-lock"

    def __init__(self, lock: LeaderLock, refresh_interval_s: float = 3.0,
                 acquire_interval_s: float = 1.5,
                 on_acquired: Callable[[], None] | None = None) -> None:
        super().__init__()
        self._lock = lock
        self._refresh_s = refresh_interval_s
        # A leader must retry a failed refresh well within the lock TTL.
        self.max_backoff_s = min(self.max_backoff_s, refresh_interval_s)
        self._acquire_s = acquire_interval_s
        self._on_acquired = on_acquired

    def interval_s(self) -> float:
        """Refresh period as leader, jittered acquire period as follower (s)."""
        if self._lock.is_leader:
            return self._refresh_s
        return jittered(self._acquire_s, 0.33)

    async def run(self) -> None:
        """:meth:`PeriodicDuty.run`, then ``dtq_scheduler_leader`` 0 (the scheduler
        releases the lock next)."""
        try:
            await super().run()
        finally:
            SCHEDULER_LEADER.set(0)

    async def tick(self) -> None:
        """Refresh while leading, else try to acquire; then set ``dtq_scheduler_leader``.

        Raises:
            store.errors.OUTAGE_ERRORS: Redis unreachable (the gauge is set all the same).
        """
        try:
            if self._lock.is_leader:
                await self._lock.refresh()
                return
            if await self._lock.acquire() and self._on_acquired is not None:
                self._on_acquired()
        finally:
            SCHEDULER_LEADER.set(1 if self._lock.is_leader else 0)
