"""The scheduler leader's firer of periodic schedules.

Every tick the leader takes the due schedules from the registry in batches of
:data:`~dtq_gateway.store.schedules.DUE_BATCH`, batch after batch until nothing is
due, so fires are enqueued at the rate they fall due (docs/schedules.md gives the
rate one gateway sustains). Per batch it costs a handful of round trips whatever the
batch size: one pipeline of HGETALLs, one enqueue of every due fire
(:meth:`Broker.enqueue_many`, idempotency key ``schedule:<name>:<fire epoch ms>``), one
pipeline of ``schedule_advance.lua`` calls and one ZADD of the next fires. The Redis
steps and why their order is safe are in :mod:`dtq_gateway.store.schedules`.

A fire enqueued more than ``LATE_MS`` after its fire time is counted in
``dtq_schedule_fires_late_total``; a fire the missed-fire policy drops (older than
``ON_TIME_MS`` and not caught up) in ``dtq_schedule_fires_missed_total{policy}``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from dtq_gateway import metrics
from dtq_gateway.domain.schedule_plan import LATE_MS, due_count, plan, policy_of, timetable_of
from dtq_gateway.duties.duty import PeriodicDuty
from dtq_gateway.duties.leader import LeaderLock
from dtq_gateway.errors import InvalidArgument
from dtq_gateway.logconf import RateLimitedLog
from dtq_gateway.settings import Settings
from dtq_gateway.store import schedules
from dtq_gateway.store.admin import redis_now_ms
from dtq_gateway.store.client import Client
from dtq_gateway.store.replies import text
from dtq_proto import dtq_pb2 as pb

log = logging.getLogger(__name__)

#: Batches taken in one tick at most (a safety bound: DUE_BATCH x this many schedules).
MAX_BATCHES_PER_TICK = 200
#: Tasks per enqueue call of the firer.
ENQUEUE_CHUNK = 1000
_POLICY_NAMES: dict[int, str] = {pb.SCHEDULE_CATCH_UP_SKIP: "skip", pb.SCHEDULE_CATCH_UP_LATEST: "latest",
                 pb.SCHEDULE_CATCH_UP_ALL: "all"}


@dataclass(slots=True)
class _Due:
    """One due schedule of a batch: what it fires now and how it advances."""

    name: str
    spec: pb.Schedule
    gen: str
    next_ms: int
    fires: list[int]
    #: fires after done_ms up to now that the policy dropped
    missed: int
    #: task id per fire enqueued so far, in order (None from the first failure on)
    task_ids: list[str | None] = field(default_factory=list)


class ScheduleFirer(PeriodicDuty):
    """Enqueues the due fires of every schedule (scheduler leader only).

    Args:
        redis: client.
        settings: gateway settings (task defaults and limits).
        lock: leadership; checked before every enqueue and every advance.
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
        """Fire every schedule due now, a batch at a time, until none is left due (a
        schedule whose fire could not be enqueued stays due for the next tick)."""
        now = await redis_now_ms(self._redis)
        stuck: set[str] = set()
        for _ in range(MAX_BATCHES_PER_TICK):
            if self.stopping or not self._lock.is_leader:
                return
            limit = schedules.DUE_BATCH + len(stuck)  # the stuck ones come back first
            due = await schedules.due_names(self._redis, now, limit=limit)
            names = [n for n in due if n not in stuck]
            if not names:
                return
            stuck.update(await self.fire_batch(names[:schedules.DUE_BATCH], now))
            if len(due) < limit:
                return

    async def fire_batch(self, names: list[str], now: int) -> set[str]:
        """Enqueue the due fires of ``names`` and record them; returns the names that
        stay due (a fire not enqueued yet, retried at the next tick)."""
        batch = await self._plan(names, now)
        if not batch or not self._lock.is_leader:
            return set()
        await self._enqueue(batch, now)
        if not self._lock.is_leader:
            return set()
        steps: list[tuple[str, str, int, int, str, int]] = []
        finals: dict[int, _Due] = {}
        for d in batch:
            for fire_ms, task_id in zip(d.fires, d.task_ids):
                if task_id is None:
                    break
                steps.append((d.name, d.gen, fire_ms, fire_ms, task_id, d.next_ms))
            if None not in d.task_ids:  # every fire enqueued: the schedule moves on
                finals[len(steps)] = d
                steps.append((d.name, d.gen, now, 0, "", d.next_ms))
        recorded = await schedules.advance_many(self._redis, steps) if steps else []
        done = [d for i, d in finals.items() if recorded[i]]
        await schedules.reschedule_many(self._redis, {d.name: d.next_ms for d in done})
        for d in done:
            if d.missed:
                metrics.SCHEDULE_FIRES_MISSED.labels(
                    policy=_POLICY_NAMES.get(policy_of(d.spec).catch_up, "skip")).inc(d.missed)
        return {d.name for d in batch if None in d.task_ids}

    async def _plan(self, names: list[str], now: int) -> list[_Due]:
        """Read the schedules and compute their due fires; a registry member without
        hash is forgotten, a paused one parked."""
        out = []
        for name, fields in zip(names, await schedules.load_many(self._redis, names)):
            if not fields:
                await schedules.forget(self._redis, name)
                continue
            if fields.get(b"paused") == b"1":
                await schedules.park(self._redis, name)
                continue
            spec = pb.Schedule.FromString(fields[b"spec"])
            table = timetable_of(spec, int(fields[b"anchor_ms"]))
            done_ms = int(fields[b"done_ms"])
            fires = plan(table, policy_of(spec), done_ms, now)
            out.append(_Due(name, spec, text(fields[b"gen"]), table.next_after(now), fires,
                            max(0, due_count(table, done_ms, now) - len(fires))))
        return out

    async def _enqueue(self, batch: list[_Due], now: int) -> None:
        """Enqueue every fire of the batch (chunks of ENQUEUE_CHUNK tasks), filling each
        schedule's ``task_ids``: a fire after a failed one of its schedule is not
        enqueued (fires are recorded in order)."""
        todo: list[tuple[_Due, int, Any]] = []
        for d in batch:
            for fire_ms in d.fires:
                try:
                    task = schedules.fire_task(d.spec, self._settings,
                                               f"schedule:{d.name}:{fire_ms}", fire_ms)
                except InvalidArgument as exc:  # e.g. a limit lowered since it was made
                    self._failed(d, f"task template refused: {exc.message}")
                    break
                todo.append((d, fire_ms, task))
        for i in range(0, len(todo), ENQUEUE_CHUNK):
            part = todo[i:i + ENQUEUE_CHUNK]
            try:
                outs = await self._broker.enqueue_many([task for _, _, task in part])
            except Exception as exc:  # noqa: BLE001 - Redis refused: retried at the next tick
                outs = [exc] * len(part)
            for (d, fire_ms, _), out in zip(part, outs):
                if None in d.task_ids:
                    continue
                if isinstance(out, Exception):
                    self._failed(d, f"fire not enqueued yet: {out!r}")
                    continue
                d.task_ids.append(str(out.task_id))
                if not out.deduplicated:
                    metrics.SCHEDULE_FIRES.inc()
                    if now - fire_ms > LATE_MS:
                        metrics.SCHEDULE_FIRES_LATE.inc()

    def _failed(self, d: _Due, why: str) -> None:
        """Count a fire that could not be enqueued now; the schedule stays due."""
        d.task_ids.append(None)
        metrics.SCHEDULE_FIRES_FAILED.inc()
        self._fail_log.log(logging.WARNING, "schedule %s: %s", d.name, why, schedule=d.name)
