"""The dispatcher's loop: one round per wake-up, and a periodic tick.

A :class:`WakeLoop` runs ``round(tick)`` whenever its event is set and at least every
``tick_s`` (the tick also runs while wake-ups keep the loop busy). A failed round is
logged (at most every 5 s) and retried after a backoff of 0.05 s doubling to 2 s; a
Redis outage (unreachable, loading, a cluster slot down or moving) is logged without a
traceback and retried at once after the backoff. :meth:`WakeLoop.stop` lets a round in
progress finish (``STOP_GRACE_S`` at most) before it cancels the loop: a round's Lua
read may already have leased entries in Redis that only the rest of the round hands to
the streams, and a round cancelled there would leave them to the visibility timeout,
spending an attempt of tasks no worker saw.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from dtq_gateway.store.errors import is_redis_outage

log = logging.getLogger(__name__)

#: Backoff after a failed round (s): first, and most.
BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 2.0
#: Most time (s) :meth:`WakeLoop.stop` waits for a round in progress before cancelling.
STOP_GRACE_S = 2.0


class WakeLoop:
    """Runs ``round(tick)`` on wake-ups (:attr:`event` set) and every ``tick_s`` s.

    Args:
        round: one dispatch round; ``tick`` is True for the periodic round.
        tick_s: period of the tick (s, > 0).
        name: the asyncio task's name.
    """

    def __init__(self, round: Callable[[bool], Awaitable[None]], tick_s: float,
                 name: str = "dtq-dispatcher") -> None:
        self.round, self.tick_s, self.name = round, tick_s, name
        #: set to run a round soon
        self.event = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._last_error_log = 0.0

    def start(self) -> None:
        """Start the loop task (again after a :meth:`stop`)."""
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        """Stop the loop: no new round starts; a round in progress may finish within
        ``STOP_GRACE_S``, then the task is cancelled and waited for, 2 s at most (a
        stop must not hang)."""
        if self._task:
            self._stopping = True
            self.event.set()
            done, _ = await asyncio.wait({self._task}, timeout=STOP_GRACE_S)
            if not done:
                self._task.cancel()
                await asyncio.wait({self._task}, timeout=2.0)

    async def _run(self) -> None:
        backoff = BACKOFF_FIRST_S
        last_tick = time.monotonic()
        while True:
            tick = False
            try:
                if not self.event.is_set():  # timeout(): a timer, not a task per wake-up
                    wait_s = max(0.0, last_tick + self.tick_s - time.monotonic())
                    async with asyncio.timeout(wait_s):
                        await self.event.wait()
            except TimeoutError:
                tick = True
            # the periodic re-check also runs while wake-ups keep the loop busy (under
            # load a wake-up comes every few ms, so waiting for a quiet tick_s would
            # starve full and stalled sessions that only the tick looks at)
            if time.monotonic() - last_tick >= self.tick_s:
                tick = True
            if self._stopping:
                return
            if tick:
                last_tick = time.monotonic()
            self.event.clear()
            try:
                await self.round(tick)
                backoff = BACKOFF_FIRST_S
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep dispatching; log and back off
                outage = is_redis_outage(exc)
                # unreachable, loading, a cluster slot down or moving: no traceback
                self._log_error("redis unavailable for leasing" if outage
                                else "dispatch round failed", exc, exc_info=not outage)
                if self._stopping:
                    return
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
                if outage:
                    self.event.set()

    def _log_error(self, msg: str, exc: BaseException, exc_info: bool) -> None:
        now = time.monotonic()
        if now - self._last_error_log > 5:
            self._last_error_log = now
            log.warning(msg, extra={"error": repr(exc)}, exc_info=exc_info)
