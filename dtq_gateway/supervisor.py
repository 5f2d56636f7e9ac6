"""Supervision of the gateway's background tasks: restart with backoff, or give up.

Every long-lived background task of a gateway replica is started through one
:class:`Supervisor`, which watches it until the gateway stops. A task that ends while
the gateway serves (it raised, it returned, something cancelled it) is a fault: the
supervisor logs it with the task's name and error, counts it in
``dtq_background_task_restarts_total{task}`` and starts it again after a capped,
jittered exponential backoff. A task that may not be restarted, or that keeps failing
(more than ``max_restarts`` restarts within ``window_s``), is given up on: one ERROR
line says why and ``on_give_up`` runs (the gateway turns its gRPC health
NOT_SERVING for every service it serves, so load balancers send calls elsewhere).

The owner of each task still stops it (its own ``stop()``, which knows how to end it
cleanly); :meth:`Supervisor.close` comes first, so a task that ends because it is
being stopped is never restarted.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from dtq_gateway.metrics import BACKGROUND_TASK_RESTARTS

log = logging.getLogger(__name__)

#: Starts one background task and returns it (a component's ``start``).
Starter = Callable[[], "asyncio.Task[object]"]
#: Called once per task given up on, with the task's name and why.
GiveUp = Callable[[str, str], Awaitable[None]]


@dataclass
class _Child:
    name: str
    start: Starter
    restart: bool
    task: asyncio.Task[object] | None = None
    #: monotonic times (s) of recent restarts, for the crash-loop bound
    restarts: collections.deque[float] = field(default_factory=collections.deque)


def started_task(start: Callable[[], object]) -> asyncio.Task[object]:
    """Call a component's ``start()`` that creates one task and returns nothing (the
    dispatcher's), and return that task, for :meth:`Supervisor.watch`.

    Raises:
        RuntimeError: ``start`` created no task, or more than one.
    """
    before = asyncio.all_tasks()
    start()
    new = asyncio.all_tasks() - before
    if len(new) != 1:
        raise RuntimeError(f"{start!r} started {len(new)} tasks, not one")
    return new.pop()


def ended_reason(task: asyncio.Task[object]) -> str:
    """How a finished task ended, for the log: ``cancelled``, ``returned`` or the
    exception's repr."""
    if task.cancelled():
        return "cancelled"
    exc = task.exception()
    return "returned" if exc is None else repr(exc)


class Supervisor:
    """Watches the gateway's background tasks; restarts them or gives up on them.

    Which task is restarted (all of them, each safe to restart), as the gateway
    registers them:

    * ``health``: the health probe's loop; it keeps no state between probes.
    * ``events-hub``: the single pub/sub reader; it resubscribes on start (events
      published while it was down are lost, as pub/sub semantics say).
    * ``metrics-refresh``: the queue-gauge refresher; every tick reads Redis afresh.
    * ``dispatcher``: the lease dispatch loop; sessions live in the dispatcher, not the
      loop, and a lease read cut short stays in the PEL, where the reaper reclaims it.
    * ``scheduler``: the leader lock keeper and the leader's duties (mover, reaper,
      sweeps, schedule firer, follow-up sweep); a duty that dies ends them all, the
      lock is released and sought again. Every state change is one atomic script.
    * ``primary-watch`` (Sentinel mode): the sentinel poll and event listeners.

    ``restart=False`` is for a task whose restart is not safe: its first fault gives
    up at once. Giving up also follows a crash loop: more than ``max_restarts``
    restarts of one task within ``window_s``. Short-lived tasks are not supervised:
    they end by design (a Lease or Subscribe stream's handler, the follow-ups of one
    outcome, which :meth:`~dtq_gateway.duties.followups.FollowUps.drain` waits for and
    the leader's follow-up sweep redoes when lost).

    Args:
        on_give_up: awaited once per task given up on, with its name and the reason.
        base_backoff_s: wait before the first restart (s); doubles per recent restart.
        max_backoff_s: longest wait before a restart (s); each wait is jittered to
            50-100 % of its value.
        max_restarts: restarts of one task allowed within ``window_s`` (>= 0).
        window_s: the crash-loop window (s).
    """

    def __init__(self, on_give_up: GiveUp | None = None, *, base_backoff_s: float = 0.1,
                 max_backoff_s: float = 5.0, max_restarts: int = 5,
                 window_s: float = 60.0) -> None:
        self.on_give_up = on_give_up
        self.base_backoff_s = base_backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_restarts = max_restarts
        self.window_s = window_s
        self._children: dict[str, _Child] = {}
        #: tasks given up on → why
        self.failed: dict[str, str] = {}
        self._pending: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def healthy(self) -> bool:
        """False once a task was given up on."""
        return not self.failed

    def watch(self, name: str, start: Starter, *, restart: bool = True) -> asyncio.Task[object]:
        """Start a background task through ``start`` and watch it until :meth:`close`.

        Args:
            name: short stable name (the metric's ``task`` label, the logs).
            start: starts the task and returns it; called again for each restart.
            restart: False when restarting the task is not safe (give up at once).

        Returns:
            The task ``start`` returned.

        Raises:
            ValueError: ``name`` is already watched.
            RuntimeError: :meth:`close` was called (the gateway is stopping): nothing
                is started.
            Whatever ``start`` raises (nothing is watched then).
        """
        if self._closed:
            raise RuntimeError(f"background task {name!r} not started: the gateway is "
                               "stopping")
        if name in self._children:
            raise ValueError(f"background task {name!r} is already supervised")
        child = _Child(name, start, restart)
        task = self._launch(child)
        # the series exists at 0 from now on: increase() in the restart alert then sees
        # the first restart too (a counter series born at 1 shows no increase)
        BACKGROUND_TASK_RESTARTS.labels(task=name)
        self._children[name] = child
        return task

    def task(self, name: str) -> asyncio.Task[object] | None:
        """The current task of ``name`` (None when not watched)."""
        child = self._children.get(name)
        return child.task if child else None

    def close(self) -> None:
        """Stop watching (before the owners stop their tasks): no restart from now on;
        restarts waiting for their backoff are cancelled."""
        self._closed = True
        for pending in self._pending:
            pending.cancel()

    def _launch(self, child: _Child) -> asyncio.Task[object]:
        task = child.start()
        child.task = task
        task.add_done_callback(functools.partial(self._ended, child))
        return task

    def _ended(self, child: _Child, task: asyncio.Task[object]) -> None:
        if self._closed or task is not child.task:
            return
        reason = ended_reason(task)
        now = time.monotonic()
        recent = child.restarts
        while recent and now - recent[0] > self.window_s:
            recent.popleft()
        if not child.restart or len(recent) >= self.max_restarts:
            why = ("ended and is not restarted" if not child.restart else
                   f"failed {len(recent) + 1} times within {self.window_s:g} s")
            self._give_up(child.name, f"{why}: {reason}")
            return
        recent.append(now)
        delay = self._backoff_s(len(recent))
        log.warning("background task %s ended (%s); restarting in %.2f s", child.name,
                    reason, delay, extra={"task": child.name, "restarts": len(recent)},
                    exc_info=None if task.cancelled() else task.exception())
        self._spawn(self._restart(child, delay))

    def _backoff_s(self, attempt: int) -> float:
        base = min(self.max_backoff_s, self.base_backoff_s * 2 ** min(attempt - 1, 16))
        return random.uniform(base / 2, base)

    async def _restart(self, child: _Child, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        if self._closed:
            return
        try:
            self._launch(child)
        except Exception as exc:  # noqa: BLE001 - a start that raises is a fault too
            self._give_up(child.name, f"could not be restarted: {exc!r}")
            return
        BACKGROUND_TASK_RESTARTS.labels(task=child.name).inc()
        log.info("background task %s restarted", child.name, extra={"task": child.name})

    def _give_up(self, name: str, why: str) -> None:
        self.failed[name] = why
        log.error("background task %s %s; health NOT_SERVING", name, why,
                  extra={"task": name})
        if self.on_give_up is not None:
            self._spawn(self.on_give_up(name, why))

    def _spawn(self, coro: Awaitable[None]) -> None:
        pending: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._pending.add(pending)
        pending.add_done_callback(self._pending.discard)
