"""Chain follow-ups' Redis work: the follow-up registry, chain records, chain_continued.lua.

:class:`~dtq_gateway.duties.followups.FollowUps` decides whether a chain step is owed
and builds it; these functions read and mark the records and list what the leader's
sweep should look at. Group bookkeeping lives in
:mod:`dtq_gateway.store.task_groups`. Each function is one round trip; Redis failures
are raised as redis-py raises them (see :mod:`dtq_gateway.store.errors`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from dtq_gateway.store import keys
from dtq_gateway.store.client import Client
from dtq_gateway.store.replies import text
from dtq_gateway.store.scripts import Script

CHAIN_CONTINUED = Script("chain_continued")


@dataclass(frozen=True, slots=True)
class ChainLink:
    """The chain fields of one task record (empty where the field is absent).

    Attributes:
        status: the task's status.
        chain_next: JSON list of the later steps' templates (base64 EnqueueRequest).
        chain_id: id of the chain's first task.
        chain_step: this task's step number (decimal text).
        next_task_id: id of the next step once it exists.
        metadata: the task's metadata as stored (a JSON object).
    """

    status: str
    chain_next: bytes
    chain_id: str
    chain_step: str
    next_task_id: str
    metadata: bytes


async def register_queue(redis: Client, queue: str) -> None:
    """Add ``queue`` to the follow-up registry ``dtq:followups:queues`` (SADD)."""
    await redis.sadd(keys.FOLLOWUP_QUEUES, queue)


async def queues(redis: Client) -> list[str]:
    """The queues of the follow-up registry that are valid queue names (SMEMBERS)."""
    return [q for q in (text(m) for m in await redis.smembers(keys.FOLLOWUP_QUEUES))
            if keys.QUEUE_RE.match(q)]


async def chain_link(redis: Client, task_id: str) -> ChainLink:
    """The chain fields of ``task_id``'s record (one HMGET; all empty when the record
    is gone)."""
    f = await redis.hmget(keys.task(task_id), "status", "chain_next", "chain_id",
                          "chain_step", "next_task_id", "metadata")
    # the client never decodes replies: hash values arrive as bytes
    return ChainLink(text(f[0]), cast(bytes, f[1] or b""), text(f[2]), text(f[3]), text(f[4]),
                     cast(bytes, f[5] or b""))


async def task_exists(redis: Client, task_id: str) -> bool:
    """Whether ``task_id``'s record exists (EXISTS)."""
    return bool(await redis.exists(keys.task(task_id)))


async def task_result(redis: Client, task_id: str) -> bytes:
    """``task_id``'s stored result (GET; b"" when there is none)."""
    return cast(bytes, await redis.get(keys.result(task_id)) or b"")


async def mark_continued(redis: Client, queue: str, task_id: str, next_id: str,
                         error: str) -> None:
    """Record that ``task_id`` (of ``queue``) was continued and drop it from the
    queue's chain-pending set (chain_continued.lua).

    Args:
        next_id: the next step's task id ("" when none will be created).
        error: why the next step could not be built ("" = none).
    """
    await CHAIN_CONTINUED(redis, [keys.task(task_id), keys.chain_pending(queue)],
                          Script.argv(task_id, next_id, error))


async def chain_steps_owed(redis: Client, queue: str, before_ms: int, count: int
                           ) -> list[str]:
    """Up to ``count`` ids of ``queue``'s tasks that owe their next chain step since
    ``before_ms`` (epoch ms) or earlier, oldest first (ZRANGEBYSCORE of the
    chain-pending set)."""
    return [text(m) for m in await redis.zrangebyscore(
        keys.chain_pending(queue), "-inf", before_ms, 0, count)]


async def groups_due(redis: Client, queue: str, now_ms: int, count: int) -> list[str]:
    """Up to ``count`` ids of ``queue``'s groups due for a check at ``now_ms`` (epoch
    ms), earliest first (ZRANGEBYSCORE of the groups-pending set)."""
    return [text(m) for m in await redis.zrangebyscore(
        keys.groups_pending(queue), "-inf", now_ms, 0, count)]
