"""The scheduler leader: due-task mover, reaper and stale-worker sweep.

Every gateway replica runs a :class:`Scheduler`; exactly one of them leads (see
:mod:`dtq_gateway.duties.leader`) and only the leader's duties do work:

* :class:`Mover` moves due members of each busy queue's schedule
  ``dtq:retry:{<queue>}:schedule`` (delayed tasks and retries waiting for their
  backoff) into their priority band. Due ids are read with ``ZRANGEBYSCORE -inf <Redis
  TIME>`` (one pipeline over the busy queues) and each is moved by ``move_due.lua``,
  which re-checks the schedule score and the task status and does the whole move
  (ZREM + XADD + status) in one script of the queue's hash slot. A move is therefore atomic:
  a crash leaves the task either still scheduled or fully queued, and a second
  attempt to move it finds it gone from the schedule and does nothing. That is why
  the seed's ``dtq:retry:claimed`` hand-off zset is not used: there is no window
  between "claimed" and "enqueued" for it to cover.
* :class:`~dtq_gateway.duties.reaper.Reaper` reclaims expired leases.
* :class:`WorkerSweep` marks workers whose heartbeats stopped (WORKER_STALE).
* :class:`~dtq_gateway.duties.queue_sweep.QueueSweep` deletes queues idle for
  DTQ_QUEUE_IDLE_DELETE_S.
* :class:`~dtq_gateway.duties.history.HistorySampler` stores a sample of every busy
  queue once a minute (the dashboard's history charts).
* :class:`~dtq_gateway.duties.schedule_firer.ScheduleFirer` enqueues the due fires of periodic
  schedules (when the gateway passes its broker).

Due times come from Redis TIME (read by the scripts themselves), never from this
process's clock, so replicas with drifting clocks agree.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any

from dtq_gateway import observe
from dtq_gateway.duties.duty import PeriodicDuty
from dtq_gateway.duties.history import HistorySampler
from dtq_gateway.duties.leader import LeaderLock, LockKeeper
from dtq_gateway.duties.queue_sweep import QueueSweep
from dtq_gateway.duties.reaper import Reaper
from dtq_gateway.duties.schedule_firer import ScheduleFirer
from dtq_gateway.settings import Settings
from dtq_gateway.store import due_tasks, reaping, stale_workers
from dtq_gateway.store.client import Client
from dtq_gateway.store.errors import is_redis_outage

log = logging.getLogger(__name__)

#: Due tasks read and moved per batch (one ZRANGEBYSCORE, one pipeline).
MOVE_BATCH = 200
#: Batches per mover tick; more due tasks wait for the next tick.
MAX_BATCHES_PER_TICK = 10
#: Workers checked per worker_sweep.lua pipeline.
SWEEP_BATCH = 500


class Mover(PeriodicDuty):
    """Moves due tasks from the retry schedule into their bands (leader only).

    Args:
        redis: client.
        settings: gateway settings (scheduler_interval_ms, task_retention_s).
        lock: leadership; every move re-checks its token inside move_due.lua.
    """

    name = "scheduler-mover"

    def __init__(self, redis: Client, settings: Settings, lock: LeaderLock) -> None:
        super().__init__()
        self._redis = redis
        self._settings = settings
        self._lock = lock
        #: Outcomes of move_due.lua since start.
        self.counts: collections.Counter[str] = collections.Counter()
        #: set by move_batch: some queue had MOVE_BATCH due tasks (another batch follows)
        self._more = False

    def interval_s(self) -> float:
        """DTQ_SCHEDULER_INTERVAL_MS in seconds."""
        return self._settings.scheduler_interval_ms / 1000

    def active(self) -> bool:
        """Only the scheduler leader moves tasks."""
        return self._lock.is_leader

    async def tick(self) -> None:
        """Move due tasks in batches until none is due, leadership ends or the cap."""
        for _ in range(MAX_BATCHES_PER_TICK):
            if self.stopping or not self._lock.is_leader:
                return
            self._more = False
            await self.move_batch()
            if not self._more:
                return

    async def move_batch(self) -> collections.Counter[str]:
        """Move up to MOVE_BATCH due tasks of each busy queue and expire up to
        MOVE_BATCH waiting tasks past their expiry; returns move_due.lua and
        expire_waiting.lua outcome counts."""
        counts: collections.Counter[str] = collections.Counter()
        if self._lock.token is None:
            return counts
        busy = await reaping.busy_queues(self._redis)
        if not busy:
            return counts
        retention_s = self._settings.task_retention_s
        due = await due_tasks.due_tasks(self._redis, busy, MOVE_BATCH)
        # waiting tasks past their expiry leave their bands too: depth and backlog age
        # (GetQueueStats, the metrics, the KEDA scaler) count live work only
        expiring = await due_tasks.expiring_tasks(self._redis, busy, MOVE_BATCH)
        replies = await due_tasks.move_due(self._redis, due, retention_s) if due else []
        if expiring:
            replies += await due_tasks.expire_waiting(self._redis, expiring, retention_s)
        for (q, task_id), reply in zip(due + expiring, replies):
            if isinstance(reply, Exception):  # retried at the next tick
                log.log(logging.WARNING if is_redis_outage(reply) else logging.ERROR,
                        "mover: move_due failed: %r", reply, extra={"task_id": task_id})
                counts["error"] += 1
                continue
            counts[reply] += 1
            if reply == "expired":
                observe.expired(q)
        self._more = any(n >= MOVE_BATCH for batch in (due, expiring)
                         for n in collections.Counter(q for q, _ in batch).values())
        self.counts.update(counts)
        return counts


class WorkerSweep(PeriodicDuty):
    """Marks workers stale whose heartbeats stopped (leader only).

    A worker hash that expired (3x the heartbeat interval without a heartbeat) is
    removed from ``dtq:workers``; one whose status is alive but whose
    ``last_heartbeat`` is older than 2x the interval becomes ``stale``. Either way
    WORKER_STALE is published exactly once, decided inside worker_sweep.lua. A
    worker that stopped gracefully (status ``stopped``) is removed from the set
    without an event once its last heartbeat is 2x the interval old, so the later
    expiry of its hash is not mistaken for a crash.
    """

    name = "worker-sweep"

    def __init__(self, redis: Client, settings: Settings, lock: LeaderLock) -> None:
        super().__init__()
        self._redis = redis
        self._settings = settings
        self._lock = lock

    def interval_s(self) -> float:
        """The heartbeat interval (s)."""
        return self._settings.heartbeat_interval_s

    def active(self) -> bool:
        """Only the scheduler leader sweeps."""
        return self._lock.is_leader

    async def tick(self) -> None:
        """Sweep every member of ``dtq:workers`` once."""
        await self.sweep()

    async def sweep(self) -> collections.Counter[str]:
        """Check every known worker; returns worker_sweep.lua outcome counts."""
        counts: collections.Counter[str] = collections.Counter()
        members = await stale_workers.worker_ids(self._redis)
        stale_after_ms = 2 * self._settings.heartbeat_interval_ms
        for start in range(0, len(members), SWEEP_BATCH):
            for reply in await stale_workers.sweep_workers(
                    self._redis, members[start:start + SWEEP_BATCH], stale_after_ms):
                counts["error" if isinstance(reply, Exception) else reply] += 1
        if counts["removed"] or counts["stale"]:
            log.info("worker sweep: %s", dict(counts))
        return counts


class Scheduler:
    """Leader election plus the leader's duties, for one gateway replica.

    Args:
        redis: client (shared with the rest of the gateway).
        settings: gateway settings; ``gateway_id`` prefixes the lock value.
        lock_ttl_ms: TTL of ``dtq:lock:scheduler`` (ms).
        refresh_interval_s: leader's lock refresh period (s).
        acquire_interval_s: followers' mean retry period (s), jittered.
        broker: the gateway's :class:`~dtq_gateway.store.broker.Broker`; without one no
            periodic schedule fires on this replica.
    """

    def __init__(self, redis: Client, settings: Settings, *, lock_ttl_ms: int = 10_000,
                 refresh_interval_s: float = 3.0, acquire_interval_s: float = 1.5,
                 broker: Any = None) -> None:
        self.lock = LeaderLock(redis, settings.gateway_id or "gateway", lock_ttl_ms)
        self.mover = Mover(redis, settings, self.lock)
        self.reaper = Reaper(redis, settings, self.lock)
        self.worker_sweep = WorkerSweep(redis, settings, self.lock)
        self.queue_sweep = QueueSweep(redis, settings, self.lock)
        self.history = HistorySampler(redis, settings, self.lock)
        self.keeper = LockKeeper(self.lock, refresh_interval_s, acquire_interval_s,
                                 on_acquired=self._on_acquired)
        self._duties: list[PeriodicDuty] = [self.keeper, self.mover, self.reaper,
                                            self.worker_sweep, self.queue_sweep, self.history]
        self.firer = ScheduleFirer(redis, settings, self.lock, broker) if broker else None
        if self.firer is not None:
            self._duties.append(self.firer)
        self._extra: list[PeriodicDuty] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._run_task: asyncio.Task[None] | None = None

    @property
    def is_leader(self) -> bool:
        """True while this replica holds the scheduler lock."""
        return self.lock.is_leader

    def add_duty(self, duty: PeriodicDuty) -> None:
        """Run one more leader duty (call before :meth:`start`); it is woken when this
        replica becomes leader and stopped with the others."""
        self._duties.append(duty)
        self._extra.append(duty)

    def _on_acquired(self) -> None:
        for duty in self._extra:
            duty.wake()
        self.reaper.leadership_started()
        for duty in self._duties[1:]:
            duty.wake()

    def start(self) -> asyncio.Task[None]:
        """Run :meth:`run` as a background task (again, after it ended: a duty that died
        ends them all); returns it."""
        if self._run_task is None or self._run_task.done():
            self._run_task = asyncio.create_task(self.run(), name="dtq-scheduler")
        return self._run_task

    async def run(self) -> None:
        """Run the lock keeper and the duties until :meth:`stop` (or cancellation)."""
        self._tasks = [asyncio.create_task(d.run(), name=f"dtq-{d.name}") for d in self._duties]
        try:
            await asyncio.gather(*self._tasks)
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._release()

    async def stop(self, timeout_s: float = 1.0) -> None:
        """Stop every duty and release the lock, so a follower takes over at once.

        Each duty may finish its current tick; cancelling one mid-tick is safe too,
        because every state change is one atomic script.

        Args:
            timeout_s: longest wait for the duties (s); stragglers are cancelled.
        """
        for duty in self._duties:
            duty.stop()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=timeout_s)
            for task in pending:
                task.cancel()
        if self._run_task is not None:
            await asyncio.gather(self._run_task, return_exceptions=True)
        await self._release()

    async def _release(self) -> None:
        try:
            await asyncio.wait_for(self.lock.release(), timeout=1.0)
        except Exception as exc:  # noqa: BLE001 - the lock then expires by its TTL
            log.warning("scheduler: could not release the lock: %r", exc)
