"""Admin.DeleteQueue's Redis work: ``delete_queue.lua``, then the keys that span queues.

The script checks and deletes one queue's keys in its hash slot (see its header for
what keeps a queue). The keys that span queues follow as single-key commands, each
step correct if the process dies after it, in the idle sweep's order (idle_queues.py):

1. ``ZREM dtq:queues <queue>``, then an EXISTS of its streams re-adds the name when a
   gateway created the queue again in between (a crash before the ZREM leaves a
   registry name without streams: ListQueues shows an empty queue, which the idle
   sweep or another DeleteQueue removes);
2. ``SREM dtq:queues:busy <queue>``, then a re-read of the busy marker
   (:func:`~dtq_gateway.store.reaping.leave_busy_set`; a crash before it leaves a
   member the reaper removes);
3. ``SREM dtq:ratelimits <queue>`` when the queue had rate limits, then an EXISTS of
   its limits hash re-adds it when SetRateLimit wrote one meanwhile; the same for the
   queue's members of the limit index ``dtq:ratelimits:index``
   (:func:`~dtq_gateway.store.ratelimits.forget_queue`);
4. the audit entry (action ``delete_queue``).

Left to expire on their own: the records and results of the queue's finished tasks
(``DTQ_TASK_RETENTION_S``, ``DTQ_RESULT_RETENTION_S``), its idempotency records
(``DTQ_IDEM_TTL_S``) and finished group records. ``dtq:queues:dead-letter`` and
``dtq:followups:queues`` keep the name (a member without keys is harmless; both are
documented as never shrinking).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dtq_gateway.errors import NotFound, WrongState
from dtq_gateway.store import keys, ratelimits, reaping
from dtq_gateway.store.admin_common import CallInfo, validate_queue
from dtq_gateway.store.audit import append_audit
from dtq_gateway.store.client import Client
from dtq_gateway.store.idle_queues import leave_registry
from dtq_gateway.store.replies import text
from dtq_gateway.store.scripts import Script

_DELETE_QUEUE = Script("delete_queue", allow_oom=True)

@dataclass(frozen=True, slots=True)
class QueueDeletion:
    """What DeleteQueue did (or, with dry_run, would do)."""

    deleted: bool
    #: the queue's Redis keys deleted (or that would be), sorted
    keys: list[str]
    #: dead-letter entries deleted with the queue (or that would be)
    dead_letters: int


def queue_keys(queue: str) -> list[str]:
    """KEYS of delete_queue.lua: every fixed-name key of ``queue`` (its hash slot)."""
    return [*keys.queue_streams_desc(queue), keys.schedule(queue), keys.dead_letter(queue),
            keys.paused(queue), keys.busy_marker(queue), keys.queue_counters(queue),
            keys.rate_limit(queue), keys.cancelled(queue), keys.chain_pending(queue),
            keys.groups_pending(queue), keys.expiring(queue), keys.finished(queue),
            keys.concurrency_limit(queue), keys.concurrency_active(queue),
            keys.concurrency_waiting(queue)]


async def _forget_concurrency_limit(redis: Client, queue: str) -> None:
    """Take a deleted queue out of ``dtq:conc:limits`` (single-key commands, as
    DeleteConcurrencyLimit does), unless SetConcurrencyLimit wrote a new limit meanwhile."""
    await redis.srem(keys.CONCURRENCY_LIMITED_QUEUES, queue)
    if await redis.exists(keys.concurrency_limit(queue)):
        await redis.sadd(keys.CONCURRENCY_LIMITED_QUEUES, queue)


@dataclass(frozen=True, slots=True)
class DeleteQueueReply:
    """delete_queue.lua's reply, decoded (:meth:`of`).

    Attributes:
        outcome: ``not_empty``, ``dead_letters``, ``absent``, ``dry_run`` or
            ``deleted``.
        depth: entries in the queue's bands; pending: of those, leased (PEL).
        scheduled: tasks of the queue waiting in the retry / delay schedule.
        followups: chain steps / group callbacks owed to the queue.
        dead_letters: entries in the queue's dead-letter stream.
        existing: the queue's keys that exist (deleted unless a dry run or refusal).
    """

    outcome: str
    depth: int
    pending: int
    scheduled: int
    followups: int
    dead_letters: int
    existing: tuple[str, ...]

    @classmethod
    def of(cls, reply: list[Any]) -> DeleteQueueReply:
        """Decode ``{outcome, depth, pending, scheduled, followups, dead letters,
        {existing keys}}``."""
        outcome, depth, pending, scheduled, followups, dead, existing = reply
        return cls(text(outcome), int(depth), int(pending), int(scheduled), int(followups),
                   int(dead), tuple(text(k) for k in existing))


async def delete_queue(redis: Client, queue: str, call: CallInfo, *, dry_run: bool = False,
                       discard_dead_letters: bool = False, reason: str = "",
                       audit_maxlen: int = 10000) -> QueueDeletion:
    """Delete a drained queue and its keys (see the module docstring), or with
    ``dry_run`` report what would go; both are audited (action ``delete_queue``).

    A paused queue is deleted (the pause flag goes with it), and so is a queue that
    workers still listen on: an idle Lease session touches none of the queue's keys,
    so it keeps listening and gets the name's next task. The consumer group cache of
    the gateways and their metric series are the caller's business.

    Raises:
        InvalidArgument: bad queue name (field ``queue``).
        NotFound: (QUEUE_NOT_FOUND) no key of the queue exists and the registry does
            not hold its name.
        WrongState: FAILED_PRECONDITION with reason QUEUE_NOT_EMPTY (tasks queued,
            leased, scheduled, or a chain step / group callback owed; the counts are
            in the message) or HAS_DEAD_LETTERS (unless ``discard_dead_letters``).
            Nothing is changed or audited.
    """
    validate_queue(queue)
    reply = DeleteQueueReply.of(await _DELETE_QUEUE(
        redis, queue_keys(queue), _DELETE_QUEUE.argv(int(discard_dead_letters), int(dry_run))))
    if reply.outcome == "not_empty":
        raise WrongState(
            f"queue: {queue!r} is not empty: depth={reply.depth} (leased={reply.pending}), "
            f"scheduled={reply.scheduled}, followups={reply.followups}; let its tasks "
            "finish, or cancel them, then delete it", reason="QUEUE_NOT_EMPTY")
    if reply.outcome == "dead_letters":
        raise WrongState(
            f"queue: {queue!r} holds {reply.dead_letters} dead letters; requeue or discard "
            "them (dtq dlq), or set discard_dead_letters to delete them with the queue",
            reason="HAS_DEAD_LETTERS")
    if reply.outcome == "absent" and await redis.zscore(keys.QUEUES, queue) is None:
        raise NotFound(f"queue: no queue named {queue!r}", reason="QUEUE_NOT_FOUND")
    found = sorted(reply.existing)
    dead = reply.dead_letters
    if not dry_run:
        await leave_registry(redis, queue)
        await reaping.leave_busy_set(redis, [queue])
        if keys.rate_limit(queue) in found:
            await redis.srem(keys.RATE_LIMITED_QUEUES, queue)
            if await redis.exists(keys.rate_limit(queue)):  # SetRateLimit meanwhile
                await redis.sadd(keys.RATE_LIMITED_QUEUES, queue)
            await ratelimits.forget_queue(redis, queue)
        if keys.concurrency_limit(queue) in found:
            await _forget_concurrency_limit(redis, queue)
    detail = f"dry_run={str(dry_run).lower()} keys={len(found)} dead_letters={dead}"
    if reason:
        detail += f"; {reason}"
    await append_audit(redis, call.actor, "delete_queue", queue, call.request_id, detail,
                       maxlen=audit_maxlen)
    return QueueDeletion(deleted=not dry_run, keys=found, dead_letters=dead)
