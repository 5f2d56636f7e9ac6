"""The scheduler leader's firer of periodic schedules.

Every tick the leader reads the due schedules from the registry and, per schedule,
enqueues each due fire with the idempotency key ``schedule:<name>:<fire epoch ms>``,
then records the progress; the Redis steps and why their order is safe are in
:mod:`dtq_gateway.store.schedules`.
"""

from __future__ import annotations

import logging
from typing import Any

from dtq_gateway import metrics
from dtq_gateway.duties.duty import PeriodicDuty
from dtq_gateway.duties.leader import LeaderLock
from dtq_gateway.errors import InvalidArgument
from dtq_gateway.logconf import RateLimitedLog
from dtq_gateway.schedule_plan import plan, policy_of, timetable_of
from dtq_gateway.settings import Settings
from dtq_gateway.store import schedules
from dtq_gateway.store.admin import redis_now_ms
from dtq_gateway.store.client import Client
from dtq_gateway.store.replies import text
from dtq_proto import dtq_pb2 as pb

log = logging.getLogger(__name__)


class ScheduleFirer(PeriodicDuty):
    """Enqueues the due fires of every schedule (scheduler leader only).

    Args:
        redis: client.
        settings: gateway settings (task defaults and limits).
        lock: leadership; checked before every enqueue.
        broker: enqueues tasks (:class:`dtq_gateway.store.broker.Broker`).
        interval_s: tick period (s); a fire is enqueued within about this much.
    """

    name = "schedule-firer"

    def __init__(self, redis: Client, settings: Settings, lock: LeaderLock, broker: Any,
                 interval_s: float = 0.5) -> None:
        super().__init__()
        self._redis, self._settings, self._lock, self._broker = redis, settings, lock, broker
        self._interval_s = interval_s
        self._fail_log = RateLimitedLog(log, every_s=30.0)

    def interval_s(self) -> float:
        """The tick period (s)."""
        return self._interval_s

    def active(self) -> bool:
        """Only the scheduler leader fires."""
        return self._lock.is_leader

    async def tick(self) -> None:
        """Fire every due schedule (at most schedules.DUE_BATCH per tick)."""
        now = await redis_now_ms(self._redis)
        for name in await schedules.due_names(self._redis, now):
            if self.stopping or not self._lock.is_leader:
                return
            await self.fire(name, now)

    async def fire(self, name: str, now: int) -> int:
        """Enqueue the due fires of one schedule; returns how many were enqueued."""
        fields = await schedules.load(self._redis, name)
        if not fields:
            await schedules.forget(self._redis, name)
            return 0
        if fields.get(b"paused") == b"1":
            await schedules.park(self._redis, name)
            return 0
        spec = pb.Schedule.FromString(fields[b"spec"])
        table = timetable_of(spec, int(fields[b"anchor_ms"]))
        gen, next_ms = text(fields[b"gen"]), table.next_after(now)
        fired = 0
        for fire_ms in plan(table, policy_of(spec), int(fields[b"done_ms"]), now):
            if not self._lock.is_leader:
                return fired
            task_id = await self._enqueue(spec, fire_ms)
            if task_id is None:
                return fired  # retried at the next tick (the registry still says due)
            fired += 1
            if not await schedules.advance(self._redis, name, gen, fire_ms, fire_ms, task_id,
                                           next_ms):
                return fired
        if await schedules.advance(self._redis, name, gen, now, 0, "", next_ms):
            await schedules.reschedule(self._redis, name, next_ms)
        return fired

    async def _enqueue(self, spec: pb.Schedule, fire_ms: int) -> str | None:
        """Enqueue one fire; its task id, or None when it could not be enqueued now."""
        try:
            task = schedules.fire_task(spec, self._settings, f"schedule:{spec.name}:{fire_ms}", fire_ms)
            (out,) = await self._broker.enqueue_many([task])
            if isinstance(out, Exception):
                raise out
        except InvalidArgument as exc:  # e.g. a limit lowered since the schedule was made
            metrics.SCHEDULE_FIRES_FAILED.inc()
            self._fail_log.log(logging.WARNING, "schedule %s: task template refused: %s",
                               spec.name, exc.message, schedule=spec.name)
            return None
        except Exception as exc:  # noqa: BLE001 - queue full, Redis refused: retry later
            metrics.SCHEDULE_FIRES_FAILED.inc()
            self._fail_log.log(logging.WARNING, "schedule %s: fire not enqueued yet: %r",
                               spec.name, exc, schedule=spec.name)
            return None
        if not out.deduplicated:
            metrics.SCHEDULE_FIRES.inc()
        return str(out.task_id)
