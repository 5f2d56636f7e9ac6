"""Periodic background duties: jittered interval, logged errors, outage backoff.

The scheduler leader's duties (lock keeping, due-task mover, reaper, stale-worker
sweep) each subclass :class:`PeriodicDuty`: ``run()`` loops until ``stop()``,
calling ``tick()`` every ``interval_s()`` seconds with ±20 % jitter so replicas
never fall into lock-step. While Redis is unreachable (ConnectionError /
TimeoutError) the loop backs off exponentially up to 5 s and logs the outage at
most every 30 s, so an outage is never a hot loop nor a log flood.
"""

from __future__ import annotations

import asyncio
import logging
import random

from dtq_gateway.logconf import RateLimitedLog
from dtq_gateway.store.errors import is_pool_busy, is_redis_outage

log = logging.getLogger(__name__)


def jittered(seconds: float, spread: float = 0.2) -> float:
    """``seconds`` scaled by a random factor in [1 - spread, 1 + spread]."""
    return max(0.0, seconds * random.uniform(1.0 - spread, 1.0 + spread))


class PeriodicDuty:
    """A background loop: ``tick()`` every jittered ``interval_s()`` until ``stop()``.

    Subclasses implement :meth:`tick` and :meth:`interval_s`, and may override
    :meth:`active` (a duty that is not active skips its tick, e.g. a follower).
    """

    name = "duty"
    #: Largest back-off between attempts while Redis is unreachable (s).
    max_backoff_s = 5.0

    def __init__(self) -> None:
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._failures = 0
        self._outage_log = RateLimitedLog(log)
        self._error_log = RateLimitedLog(log, every_s=10.0)

    def interval_s(self) -> float:
        """Seconds between ticks (before jitter)."""
        raise NotImplementedError

    def active(self) -> bool:
        """Whether the next tick should run (default: always)."""
        return True

    async def tick(self) -> None:
        """One round of work; must be bounded in time."""
        raise NotImplementedError

    def stop(self) -> None:
        """Ask the loop to end after the current tick."""
        self._stop.set()

    def wake(self) -> None:
        """Run the next tick now instead of waiting for the interval."""
        self._wake.set()

    @property
    def failures(self) -> int:
        """Consecutive failed ticks (0 after a successful one)."""
        return self._failures

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stop.is_set()

    async def run(self) -> None:
        """Loop until :meth:`stop`; never raises except CancelledError."""
        while not self._stop.is_set():
            delay = jittered(self.interval_s())
            if self.active():
                delay = await self._guarded_tick(delay)
            await self._sleep(delay)

    async def _guarded_tick(self, delay: float) -> float:
        """Run one tick; return the delay before the next (backoff after errors)."""
        try:
            await self.tick()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a duty must survive its own bugs
            if not is_redis_outage(exc):
                self._failures += 1
                self._error_log.log(logging.ERROR, "%s: tick failed", self.name,
                                    exc_info=True, duty=self.name)
                return max(delay, self._backoff_s())
            self._failures += 1
            if is_pool_busy(exc):  # every pooled connection in use: busy, not an outage
                self._outage_log.log(logging.INFO, "%s: no free Redis connection (pool "
                                     "busy), backing off", self.name, duty=self.name)
            else:
                self._outage_log.log(logging.WARNING, "%s: Redis unavailable, backing off: "
                                     "%r", self.name, exc, duty=self.name)
            return self._backoff_s()
        if self._failures:
            log.info("%s: recovered after %d failed ticks", self.name, self._failures,
                     extra={"duty": self.name})
            self._failures = 0
            self._outage_log.reset()
            self._error_log.reset()
        return delay

    def _backoff_s(self) -> float:
        base = min(self.max_backoff_s, 0.1 * (2 ** min(self._failures, 10)))
        return random.uniform(base / 2, base)

    async def _sleep(self, seconds: float) -> None:
        """Wait ``seconds``, returning early on stop() or wake()."""
        if self._wake.is_set():
            self._wake.clear()
            return
        stop_wait = asyncio.ensure_future(self._stop.wait())
        wake_wait = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({stop_wait, wake_wait}, timeout=seconds,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_wait.cancel()
            wake_wait.cancel()
        self._wake.clear()
