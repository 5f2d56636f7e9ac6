"""Periodic schedules: storage, the Admin operations and the Redis steps of the leader's firer.

Each schedule is one hash ``dtq:schedule:<name>`` (definition and state); the
registry ``dtq:schedules`` is a sorted set of names scored by their next fire
(+inf while paused). Both are global, so (for Redis Cluster) nothing touches the
two in one command: every step is a single-key command or a one-key script, in an
order that stays correct if the process dies between steps:

* create: HSET the hash, then ZADD the registry (a crash leaves an unlisted hash,
  which the next create of the name overwrites);
* delete: DEL the hash, then ZREM (a crash leaves a registry member without hash,
  which the firer removes);
* fire (scheduler leader only, :class:`dtq_gateway.duties.schedule_firer.ScheduleFirer`): read the due names from the
  registry, enqueue each due fire with the internal deduplication key
  ``schedule:<name>:<fire epoch ms>`` (its record is out of any client key's reach:
  :func:`keys.internal_idempotency_digest`), record the progress in the hash
  (``schedule_advance.lua``: ``done_ms``, last fire, next fire), then ZADD the next
  fire. A leader that dies after the enqueue makes the next leader enqueue the same
  fire again, which the idempotency record deduplicates; two replicas that both
  believe they lead do the same. Each fire therefore becomes exactly one task (as
  long as the idempotency record lives: DTQ_IDEM_TTL_S after the task ends).

Hash fields: ``spec`` (the serialized dtq.v1.Schedule), ``gen`` (changes on
replace), ``anchor_ms``, ``created_at_ms``, ``done_ms`` (every fire at or before it is
handled), ``next_fire_ms``, ``last_fire_ms``, ``last_task_id``, ``fires_total``,
``paused`` ("1"/"0"). Times are Redis TIME, epoch ms.
"""

from __future__ import annotations

import logging
import math
import uuid
from dataclasses import replace
from typing import Any

from redis.asyncio import Redis

from dtq_gateway.errors import AlreadyExists, InvalidArgument, NotFound
from dtq_gateway.schedule_plan import timetable_of, validate_spec
from dtq_gateway.settings import Settings
from dtq_gateway.store import keys
from dtq_gateway.store.admin import redis_now_ms
from dtq_gateway.store.replies import text
from dtq_gateway.store.scripts import Script
from dtq_gateway.validation import MAX_METADATA_ENTRIES, NewTask, validate_enqueue
from dtq_proto import dtq_pb2 as pb

log = logging.getLogger(__name__)

ADVANCE = Script("schedule_advance")
UPDATE = Script("schedule_update")
#: Due schedules handled per firer tick; more wait for the next tick.
DUE_BATCH = 100


def _check_name(name: str, field: str = "name") -> str:
    if not keys.SCHEDULE_RE.match(name):
        raise InvalidArgument(f"{field}: must match [A-Za-z0-9_.-]{{1,64}}", field=field)
    return name


def fire_task(spec: pb.Schedule, settings: Settings, idem_key: str, fire_ms: int,
              now_ms: int | None = None, prefix: str = "schedule.task.") -> NewTask:
    """The task of one fire: the template plus idempotency key and metadata.

    ``idem_key`` ("" for none) is an internal deduplication key: its record is named by
    :func:`keys.internal_idempotency_digest`, out of reach of any client's key (a
    producer enqueuing with ``schedule:<name>:<fire ms>`` cannot take the fire over).

    Raises:
        InvalidArgument: the template is invalid (field named with ``prefix``).
    """
    req = pb.EnqueueRequest()
    req.CopyFrom(spec.task)
    req.idempotency_key = idem_key
    if len(req.metadata) <= MAX_METADATA_ENTRIES - 2:
        req.metadata["dtq.schedule"] = spec.name
        req.metadata["dtq.fire_ms"] = str(fire_ms)
    task = validate_enqueue(req, settings, prefix, now_ms)
    if not idem_key:
        return task
    return replace(task, idem_digest=keys.internal_idempotency_digest(idem_key))


def validate(spec: pb.Schedule, settings: Settings) -> None:
    """Check a schedule and its task template.

    Raises:
        InvalidArgument: naming the field (``schedule.cron``, ``schedule.task.queue``...).
    """
    validate_spec(spec)
    t = spec.task
    for field in ("idempotency_key", "delay_ms", "not_before_ms", "expires_at_ms"):
        if getattr(t, field):
            raise InvalidArgument(f"schedule.task.{field}: must be empty in a schedule",
                                  field=f"schedule.task.{field}")
    fire_task(spec, settings, f"schedule:{spec.name}:0", 0)


def info_of(fields: dict[bytes, bytes]) -> pb.ScheduleInfo:
    """A stored hash as a ScheduleInfo."""
    spec = pb.Schedule.FromString(fields.get(b"spec", b""))
    spec.paused = fields.get(b"paused") == b"1"

    def num(name: bytes) -> int:
        return int(fields.get(name) or 0)

    return pb.ScheduleInfo(schedule=spec, next_fire_ms=0 if spec.paused else num(b"next_fire_ms"),
                           last_fire_ms=num(b"last_fire_ms"),
                           last_task_id=text(fields.get(b"last_task_id", b"")),
                           fires_total=num(b"fires_total"), created_at_ms=num(b"created_at_ms"))


async def create(redis: Redis, settings: Settings, spec: pb.Schedule, replace: bool
                 ) -> tuple[pb.ScheduleInfo, bool]:
    """Store a schedule; returns (its info, True when new).

    Raises:
        InvalidArgument: a bad field. AlreadyExists: the name is taken and not ``replace``.
    """
    validate(spec, settings)
    exists = await redis.zscore(keys.SCHEDULES, spec.name) is not None
    if exists and not replace:
        raise AlreadyExists(f"schedule {spec.name!r} exists (set replace to overwrite)",
                            field="schedule.name")
    now = await redis_now_ms(redis)
    next_ms = timetable_of(spec, now).next_after(now)
    stored = pb.Schedule()
    stored.CopyFrom(spec)
    stored.paused = False
    fields: dict[str, Any] = {
        "spec": stored.SerializeToString(), "gen": uuid.uuid4().hex, "anchor_ms": now,
        "created_at_ms": now, "done_ms": now, "next_fire_ms": next_ms, "last_fire_ms": 0,
        "last_task_id": "", "fires_total": 0, "paused": "1" if spec.paused else "0"}
    pipe = redis.pipeline(transaction=True)  # one key: DEL + HSET together
    pipe.delete(keys.periodic_schedule(spec.name))
    pipe.hset(keys.periodic_schedule(spec.name), mapping=fields)
    await pipe.execute()
    await redis.zadd(keys.SCHEDULES, {spec.name: math.inf if spec.paused else next_ms})
    log.info("schedule stored", extra={"schedule": spec.name, "replaced": exists})
    return info_of({k.encode(): v if isinstance(v, bytes) else str(v).encode()
                    for k, v in fields.items()}), not exists


async def get(redis: Redis, name: str) -> pb.ScheduleInfo:
    """One schedule. Raises NotFound / InvalidArgument."""
    fields = await redis.hgetall(keys.periodic_schedule(_check_name(name)))
    if not fields or await redis.zscore(keys.SCHEDULES, name) is None:
        raise NotFound(f"schedule {name!r} not found", field="name")
    return info_of(fields)


async def list_page(redis: Redis, size: int, token: str) -> tuple[list[pb.ScheduleInfo], str]:
    """Schedules sorted by name after ``token`` (the last name of the previous page)."""
    if token:
        _check_name(token, "page_token")
    names = sorted(n for n in (text(m) for m in await redis.zrange(keys.SCHEDULES, 0, -1))
                   if n > token)
    page = names[:size]
    pipe = redis.pipeline(transaction=False)
    for name in page:
        pipe.hgetall(keys.periodic_schedule(name))
    infos = [info_of(f) for f in await pipe.execute() if f]
    return infos, (page[-1] if len(names) > size else "")


async def set_paused(redis: Redis, name: str, paused: bool) -> pb.ScheduleInfo:
    """Pause, or resume from now on (fires due while paused are skipped).

    Raises:
        NotFound: no such schedule.
    """
    key = keys.periodic_schedule(_check_name(name))
    if paused:
        updated = await UPDATE(redis, [key], UPDATE.argv("paused", "1"))
        score = math.inf
    else:
        spec_raw, anchor = await redis.hmget(key, "spec", "anchor_ms")
        now = await redis_now_ms(redis)
        score = timetable_of(pb.Schedule.FromString(spec_raw or b""),
                             int(anchor or 0)).next_after(now) if spec_raw else 0
        updated = await UPDATE(redis, [key], UPDATE.argv("paused", "0", "done_ms", now,
                                                         "next_fire_ms", score))
    if not int(updated):
        raise NotFound(f"schedule {name!r} not found", field="name")
    await redis.zadd(keys.SCHEDULES, {name: score}, xx=True)
    return await get(redis, name)


async def trigger(redis: Redis, settings: Settings, broker: Any, name: str) -> str:
    """Enqueue the schedule's task now (no idempotency key); returns the task id.

    Raises:
        NotFound: no such schedule. QueueFull and Redis errors of the enqueue.
    """
    spec_raw = await redis.hget(keys.periodic_schedule(_check_name(name)), "spec")
    if spec_raw is None:
        raise NotFound(f"schedule {name!r} not found", field="name")
    now = await redis_now_ms(redis)
    (out,) = await broker.enqueue_many([fire_task(pb.Schedule.FromString(spec_raw), settings,
                                                  "", now)])
    if isinstance(out, Exception):
        raise out
    await UPDATE(redis, [keys.periodic_schedule(name)], UPDATE.argv("last_task_id", out.task_id))
    return str(out.task_id)


async def delete(redis: Redis, name: str) -> bool:
    """Remove a schedule; True when there was one."""
    deleted = await redis.delete(keys.periodic_schedule(_check_name(name)))
    removed = await redis.zrem(keys.SCHEDULES, name)
    return bool(deleted or removed)


# -- the scheduler leader's firer (dtq_gateway.duties.schedule_firer) ------------------
async def due_names(redis: Redis, now_ms: int, limit: int = DUE_BATCH) -> list[str]:
    """Names of schedules due at ``now_ms`` (epoch ms), at most ``limit``, soonest first."""
    due = await redis.zrangebyscore(keys.SCHEDULES, "-inf", now_ms, start=0, num=limit)
    return [text(name) for name in due]


async def load(redis: Redis, name: str) -> dict[bytes, bytes]:
    """Every field of schedule ``name`` (module docstring); {} when it has no hash."""
    return await redis.hgetall(keys.periodic_schedule(name))


async def park(redis: Redis, name: str) -> None:
    """Score a paused schedule +inf in the registry (never due until resumed)."""
    await redis.zadd(keys.SCHEDULES, {name: math.inf}, xx=True)


async def advance(redis: Redis, name: str, gen: str, done_ms: int, fire_ms: int,
                  task_id: str, next_ms: int) -> bool:
    """Record progress on the hash (``schedule_advance.lua``): every fire at or before
    ``done_ms`` is handled, ``fire_ms``/``task_id`` the last fire (0/"" for none),
    ``next_ms`` the next one. False when the schedule was replaced (``gen`` changed) or
    deleted meanwhile. Times are epoch ms."""
    reply = await ADVANCE(redis, [keys.periodic_schedule(name)],
                          ADVANCE.argv(gen, done_ms, fire_ms, task_id, next_ms))
    return text(reply) == "ok"


async def reschedule(redis: Redis, name: str, next_ms: int) -> None:
    """Score schedule ``name`` by its next fire (epoch ms) in the registry."""
    await redis.zadd(keys.SCHEDULES, {name: next_ms}, xx=True)


async def forget(redis: Redis, name: str) -> None:
    """Drop a registry member whose hash is gone (a delete that died halfway); a
    create racing this re-adds it from its hash."""
    await redis.zrem(keys.SCHEDULES, name)
    raw = await redis.hget(keys.periodic_schedule(name), "next_fire_ms")
    if raw is not None:
        await redis.zadd(keys.SCHEDULES, {name: int(raw)}, nx=True)
