"""Periodic schedules: storage, the Admin operations and the Redis steps of the leader's firer.

Each schedule is one hash ``dtq:schedule:<name>`` (definition and state); the
registry ``dtq:schedules`` is a sorted set of names scored by their next fire
(+inf while paused). Both are global, so (for Redis Cluster) nothing touches the
two in one command: every step is a single-key command or a one-key script, in an
order that stays correct if the process dies between steps:

* create: HSET the hash, then ZADD the registry, then ZADD the name index (a crash
  leaves an unlisted hash, which the next create of the name overwrites, or a
  schedule missing from the index, which the next create or the firer's forget adds);
* delete: DEL the hash, then ZREM the registry, then the index (a crash leaves a
  registry member without hash, which the firer removes, or an index member without
  hash, which ListSchedules skips);
* fire (scheduler leader only, :class:`dtq_gateway.duties.schedule_firer.ScheduleFirer`): read the due names from the
  registry, enqueue each due fire with the internal deduplication key
  ``schedule:<name>:<fire epoch ms>`` (its record is out of any client key's reach:
  :func:`keys.internal_idempotency_digest`), record the progress in the hash
  (``schedule_advance.lua``: ``done_ms``, last fire, next fire), then ZADD the next
  fire. A leader that dies after the enqueue makes the next leader enqueue the same
  fire again, which the idempotency record deduplicates; two replicas that both
  believe they lead do the same. Each fire therefore becomes exactly one task (as
  long as the idempotency record lives: DTQ_IDEM_TTL_S after the task ends).

ListSchedules pages through the name index ``dtq:schedules:names`` (every score 0)
with ZRANGEBYLEX, reading only the page's hashes; schedules stored before the index
existed are added to it once (``dtq:schedules:names:built``). DTQ_MAX_SCHEDULES caps
the registry: a create of a new name beyond it is refused (ZCARD before the write, so
replicas creating at the same instant may pass it by a few).

Hash fields: ``spec`` (the serialized dtq.v1.Schedule), ``gen`` (changes on
replace), ``anchor_ms``, ``created_at_ms``, ``done_ms`` (every fire at or before it is
handled), ``next_fire_ms``, ``last_fire_ms``, ``last_task_id``, ``fires_total``,
``paused`` ("1"/"0"). Times are Redis TIME, epoch ms.
"""

from __future__ import annotations

import enum
import logging
import math
import uuid
from dataclasses import replace
from typing import Any, cast

from dtq_gateway import metrics
from dtq_gateway.domain.schedule_plan import timetable_of, validate_spec
from dtq_gateway.domain.validation import MAX_METADATA_ENTRIES, NewTask, validate_enqueue
from dtq_gateway.errors import AlreadyExists, InvalidArgument, NotFound, ScheduleLimit
from dtq_gateway.settings import Settings
from dtq_gateway.store import keys
from dtq_gateway.store.admin_common import redis_now_ms
from dtq_gateway.store.client import Client
from dtq_gateway.store.replies import text
from dtq_gateway.store.scripts import Script, ScriptPipeline, execute
from dtq_proto import dtq_pb2 as pb

log = logging.getLogger(__name__)

ADVANCE = Script("schedule_advance")
UPDATE = Script("schedule_update")
#: Due schedules read per batch of the firer; a tick takes batch after batch until
#: nothing is due (dtq_gateway.duties.schedule_firer).
DUE_BATCH = 500
#: Names added per ZADD when the name index is built for older data.
_INDEX_CHUNK = 1000


class Advance(enum.Enum):
    """schedule_advance.lua's reply, decoded (:meth:`of`)."""

    #: the progress was recorded
    OK = "ok"
    #: the schedule was deleted meanwhile
    GONE = "gone"
    #: the schedule was replaced meanwhile (its gen changed)
    STALE = "stale"
    #: the schedule is paused: nothing changed
    PAUSED = "paused"

    @classmethod
    def of(cls, reply: Any) -> Advance:
        """Decode the script's status string. Raises ValueError for an unknown one."""
        return cls(text(reply))


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


async def create(redis: Client, settings: Settings, spec: pb.Schedule, replace: bool
                 ) -> tuple[pb.ScheduleInfo, bool]:
    """Store a schedule; returns (its info, True when new).

    Raises:
        InvalidArgument: a bad field. AlreadyExists: the name is taken and not ``replace``.
    """
    validate(spec, settings)
    async with redis.pipeline(transaction=False) as check:
        check.zscore(keys.SCHEDULES, spec.name)
        check.zcard(keys.SCHEDULES)
        score, count = await check.execute()
    exists = score is not None
    if exists and not replace:
        raise AlreadyExists(f"schedule {spec.name!r} exists (set replace to overwrite)",
                            field="schedule.name")
    if not exists and count >= settings.max_schedules:
        metrics.LIMIT_REFUSALS.labels(limit="max_schedules").inc()
        raise ScheduleLimit(f"schedule.name: schedule {spec.name!r} would be new and "
                            f"{count} schedules exist (DTQ_MAX_SCHEDULES="
                            f"{settings.max_schedules})", field="schedule.name")
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
    pipe.hset(keys.periodic_schedule(spec.name), mapping=cast("dict[Any, Any]", fields))
    await pipe.execute()
    await redis.zadd(keys.SCHEDULES, {spec.name: math.inf if spec.paused else next_ms})
    await redis.zadd(keys.SCHEDULE_NAMES, {spec.name: 0})
    log.info("schedule stored", extra={"schedule": spec.name, "replaced": exists})
    return info_of({k.encode(): v if isinstance(v, bytes) else str(v).encode()
                    for k, v in fields.items()}), not exists


async def get(redis: Client, name: str) -> pb.ScheduleInfo:
    """One schedule. Raises NotFound / InvalidArgument."""
    fields = await redis.hgetall(keys.periodic_schedule(_check_name(name)))
    if not fields or await redis.zscore(keys.SCHEDULES, name) is None:
        raise NotFound(f"schedule {name!r} not found", field="name")
    return info_of(cast(dict[bytes, bytes], fields))  # the client never decodes replies


async def list_page(redis: Client, size: int, token: str) -> tuple[list[pb.ScheduleInfo], str]:
    """Schedules sorted by name after ``token`` (the last name of the previous page).

    One ZRANGEBYLEX of the name index and one HGETALL per schedule of the page: the
    cost does not grow with the number of schedules. Index members whose hash is gone
    (a delete that died halfway) are skipped.

    Returns:
        Up to ``size`` schedules, and the next page token ("" after the last page).

    Raises:
        InvalidArgument: ``page_token`` is not a schedule name.
    """
    if token:
        _check_name(token, "page_token")
    await _ensure_names_index(redis)
    names = [text(n) for n in await redis.zrangebylex(
        keys.SCHEDULE_NAMES, f"({token}" if token else "-", "+", start=0, num=size + 1)]
    page = names[:size]
    pipe = redis.pipeline(transaction=False)
    for name in page:
        pipe.hgetall(keys.periodic_schedule(name))
    infos = [info_of(f) for f in await pipe.execute() if f]
    return infos, (page[-1] if len(names) > size else "")


async def _ensure_names_index(redis: Client) -> None:
    """Build the name index from the registry once (schedules stored before the index
    existed); afterwards one GET per listing."""
    if await redis.get(keys.SCHEDULE_NAMES_BUILT):
        return
    names = [text(n) for n in await redis.zrange(keys.SCHEDULES, 0, -1)]
    for i in range(0, len(names), _INDEX_CHUNK):
        await redis.zadd(keys.SCHEDULE_NAMES, dict.fromkeys(names[i:i + _INDEX_CHUNK], 0))
    await redis.set(keys.SCHEDULE_NAMES_BUILT, "1")
    log.info("schedule name index built", extra={"schedules": len(names)})


async def set_paused(redis: Client, name: str, paused: bool) -> pb.ScheduleInfo:
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


async def trigger(redis: Client, settings: Settings, broker: Any, name: str) -> str:
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


async def delete(redis: Client, name: str) -> bool:
    """Remove a schedule; True when there was one."""
    deleted = await redis.delete(keys.periodic_schedule(_check_name(name)))
    removed = await redis.zrem(keys.SCHEDULES, name)
    await redis.zrem(keys.SCHEDULE_NAMES, name)
    return bool(deleted or removed)


# -- the scheduler leader's firer (dtq_gateway.duties.schedule_firer) ------------------
async def due_names(redis: Client, now_ms: int, limit: int = DUE_BATCH) -> list[str]:
    """Names of schedules due at ``now_ms`` (epoch ms), at most ``limit``, soonest first."""
    due = await redis.zrangebyscore(keys.SCHEDULES, "-inf", now_ms, start=0, num=limit)
    return [text(name) for name in due]


async def load_many(redis: Client, names: list[str]) -> list[dict[bytes, bytes]]:
    """Every field of each schedule of ``names`` (module docstring), in order ({} for
    one without hash): one pipeline."""
    pipe = redis.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(keys.periodic_schedule(name))
    return list(await pipe.execute())


async def advance_many(redis: Client, steps: list[tuple[str, str, int, int, str, int]]
                       ) -> list[bool]:
    """:func:`advance` for many steps, in order, in one pipeline: each step is (name, gen,
    done_ms, fire_ms, task_id, next_ms). Steps of one schedule run in the order given.

    Returns:
        Per step, True when recorded (False: replaced, deleted or paused meanwhile).

    Raises:
        A Redis error of any step.
    """
    pipe = ScriptPipeline(redis)
    for name, gen, done_ms, fire_ms, task_id, next_ms in steps:
        ADVANCE.queue(pipe, [keys.periodic_schedule(name)],
                      ADVANCE.argv(gen, done_ms, fire_ms, task_id, next_ms))
    out = []
    for reply in await execute(redis, pipe):
        if isinstance(reply, Exception):
            raise reply
        out.append(Advance.of(reply) is Advance.OK)
    return out


async def reschedule_many(redis: Client, next_ms: dict[str, int]) -> None:
    """:func:`reschedule` for many schedules (name -> next fire, epoch ms) in one ZADD."""
    if next_ms:
        await redis.zadd(keys.SCHEDULES, next_ms, xx=True)


async def load(redis: Client, name: str) -> dict[bytes, bytes]:
    """Every field of schedule ``name`` (module docstring); {} when it has no hash."""
    return cast(dict[bytes, bytes], await redis.hgetall(keys.periodic_schedule(name)))


async def park(redis: Client, name: str) -> None:
    """Score a paused schedule +inf in the registry (never due until resumed)."""
    await redis.zadd(keys.SCHEDULES, {name: math.inf}, xx=True)


async def advance(redis: Client, name: str, gen: str, done_ms: int, fire_ms: int,
                  task_id: str, next_ms: int) -> bool:
    """Record progress on the hash (``schedule_advance.lua``): every fire at or before
    ``done_ms`` is handled, ``fire_ms``/``task_id`` the last fire (0/"" for none),
    ``next_ms`` the next one. False when the schedule was replaced (``gen`` changed) or
    deleted meanwhile. Times are epoch ms."""
    reply = await ADVANCE(redis, [keys.periodic_schedule(name)],
                          ADVANCE.argv(gen, done_ms, fire_ms, task_id, next_ms))
    return Advance.of(reply) is Advance.OK


async def reschedule(redis: Client, name: str, next_ms: int) -> None:
    """Score schedule ``name`` by its next fire (epoch ms) in the registry."""
    await redis.zadd(keys.SCHEDULES, {name: next_ms}, xx=True)


async def forget(redis: Client, name: str) -> None:
    """Drop a registry member whose hash is gone (a delete that died halfway); a
    create racing this re-adds it from its hash."""
    await redis.zrem(keys.SCHEDULES, name)
    await redis.zrem(keys.SCHEDULE_NAMES, name)
    raw = await redis.hget(keys.periodic_schedule(name), "next_fire_ms")
    if raw is not None:
        await redis.zadd(keys.SCHEDULES, {name: int(raw)}, nx=True)
        await redis.zadd(keys.SCHEDULE_NAMES, {name: 0})
