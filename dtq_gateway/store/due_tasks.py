"""The due-task mover's Redis work: due members of the schedules, move_due.lua.

:class:`~dtq_gateway.duties.scheduler.Mover` picks the busy queues
(:func:`dtq_gateway.store.reaping.busy_queues`), batches and counts; these functions
read what is due by Redis TIME and move it. Redis failures of a whole round trip are
raised as redis-py raises them (see :mod:`dtq_gateway.store.errors`).
"""

from __future__ import annotations

from typing import Any

from dtq_gateway.store import keys
from dtq_gateway.store.admin_common import redis_now_ms
from dtq_gateway.store.client import Client
from dtq_gateway.store.replies import text
from dtq_gateway.store.scripts import Script, ScriptPipeline, execute

_MOVE_DUE = Script("move_due", allow_oom=True)


async def due_tasks(redis: Client, queues: list[str], count: int) -> list[tuple[str, str]]:
    """The members of each queue's schedule ``dtq:retry:{<queue>}:schedule`` due by
    Redis TIME, at most ``count`` per queue, earliest first.

    Two round trips: TIME, then one ZRANGEBYSCORE ``-inf <now ms>`` per queue in one
    pipeline.

    Returns:
        (queue, task id) pairs, queue by queue in the order of ``queues``.
    """
    now_ms = await redis_now_ms(redis)
    pipe = redis.pipeline(transaction=False)
    for q in queues:
        pipe.zrangebyscore(keys.schedule(q), "-inf", now_ms, start=0, num=count)
    return [(q, text(m)) for q, members in zip(queues, await pipe.execute())
            for m in members]


async def move_due(redis: Client, due: list[tuple[str, str]], task_retention_s: int
                   ) -> list[str | Exception]:
    """Move due tasks from their schedule into their priority band, one move_due.lua
    call each (its header lists the checks).

    Two round trips: one pipeline of HMGET (queue, priority, idempotency digest) per
    task for the script's keys, then one pipeline of the scripts.

    Args:
        due: (queue, task id) pairs from :func:`due_tasks`.
        task_retention_s: EXPIRE of the moved task's record (s).

    Returns:
        Per task, in order, the script's outcome ("moved", "expired", "gone",
        "skipped", "not_due", "retry") or its error.
    """
    records = await _key_fields(redis, due)
    pipe = ScriptPipeline(redis)
    for (q, task_id), (_, priority, digest) in zip(due, records):
        _MOVE_DUE.queue(pipe, _move_keys(q, task_id, priority, digest),
                        _MOVE_DUE.argv("", task_id, task_retention_s))
    return [r if isinstance(r, Exception) else text(r) for r in await execute(redis, pipe)]


def _move_keys(queue: str, task_id: str, priority: object, digest: object) -> list[str]:
    """KEYS of move_due.lua; without a readable hash only the first two."""
    keys_ = [keys.schedule(queue), keys.task(task_id)]
    band = text(priority)
    if len(band) != 1 or band not in "0123456789":
        return keys_
    keys_ += [keys.stream(queue, int(band)), keys.expiring(queue)]
    if text(digest):
        keys_.append(keys.idempotency(queue, text(digest)))
    return keys_


_EXPIRE_WAITING = Script("expire_waiting")


async def expiring_tasks(redis: Client, queues: list[str], count: int
                         ) -> list[tuple[str, str]]:
    """The members of each queue's expiry index ``dtq:expiring:{<queue>}`` whose expiry
    passed by Redis TIME, at most ``count`` per queue, earliest first (two round trips:
    TIME, one pipeline of ZRANGEBYSCORE).

    Returns:
        (queue, task id) pairs, queue by queue in the order of ``queues``.
    """
    now_ms = await redis_now_ms(redis)
    pipe = redis.pipeline(transaction=False)
    for q in queues:
        pipe.zrangebyscore(keys.expiring(q), "-inf", now_ms, start=0, num=count)
    return [(q, text(m)) for q, members in zip(queues, await pipe.execute())
            for m in members]


async def expire_waiting(redis: Client, due: list[tuple[str, str]], task_retention_s: int
                         ) -> list[str | Exception]:
    """Expire waiting tasks whose expiry passed before a worker started them, one
    expire_waiting.lua call each (its header lists the checks): their band entries go,
    so depth and backlog age count live work only.

    Two round trips: one pipeline of HMGET (queue, priority, idempotency digest) per
    task for the script's keys, then one pipeline of the scripts.

    Args:
        due: (queue, task id) pairs from :func:`expiring_tasks`.
        task_retention_s: EXPIRE of the expired task's record (s).

    Returns:
        Per task, in order, the script's outcome ("expired", "reading", "gone",
        "skipped", "not_due", "retry") or its error.
    """
    records = await _key_fields(redis, due)
    pipe = ScriptPipeline(redis)
    for (q, task_id), (_, priority, digest) in zip(due, records):
        keys_ = [keys.expiring(q), keys.task(task_id)]
        band = text(priority)
        if len(band) == 1 and band in "0123456789":
            keys_.append(keys.stream(q, int(band)))
            if text(digest):
                keys_.append(keys.idempotency(q, text(digest)))
        _EXPIRE_WAITING.queue(pipe, keys_,
                              _EXPIRE_WAITING.argv(task_id, task_retention_s, keys.GROUP))
    return [r if isinstance(r, Exception) else text(r) for r in await execute(redis, pipe)]


async def _key_fields(redis: Client, due: list[tuple[str, str]]) -> list[list[Any]]:
    """One pipeline of HMGET (queue, priority, idempotency digest) per due task: what
    the scripts need to name their keys. Per task, in order, the three values (None
    where missing)."""
    pipe = redis.pipeline(transaction=False)
    for _, task_id in due:
        pipe.hmget(keys.task(task_id), "queue", "priority", "idem_digest")
    return await pipe.execute()
