"""Dead-letter administration: list, requeue, discard, purge and filtered redrive.

Each queue has its own dead-letter stream ``dtq:stream:{<queue>}:dead-letter`` (in the
queue's hash slot, so the scripts that dead-letter a task write it atomically with the
task record); ``dtq:queues:dead-letter`` lists the queues that may have entries. A
listing over every queue merges the queues' streams by entry id (newest first), with
the queue name as tie-break; its page token is ``<entry id>/<queue>``.

Each state change is one Lua script of one queue (``lua/requeue_dead_letter.lua``,
``discard_dead_letter.lua``); its audit entry is appended right after it (the audit
stream spans queues). Scans use ``lua/dlq_scan.lua``, which returns entries without
their payloads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from dtq_gateway.errors import DtqError, InvalidArgument, NotFound, WrongState
from dtq_gateway.store import keys
from dtq_gateway.store.admin_common import (
    CallInfo,
    as_int,
    entry_ms,
    redis_now_ms,
    validate_page_token,
    validate_queue,
)
from dtq_gateway.store.admin_scripts import (
    DISCARD_DEAD_LETTER,
    DLQ_SCAN,
    REQUEUE_DEAD_LETTER,
)
from dtq_gateway.store.audit import append_audit
from dtq_gateway.store.client import Client
from dtq_gateway.store.indexes import mark_busy
from dtq_gateway.store.replies import text
from dtq_gateway.store.scripts import ScriptPipeline, execute
from dtq_gateway.store.task_record import normalize

log = logging.getLogger(__name__)

SCAN_PAGE = 500
#: Most entries one ListDeadLetters call with a queue filter examines.
LIST_SCAN_MAX = 10000
#: Most task ids a RedriveDeadLetters reply lists.
REDRIVE_LIST_MAX = 1000


@dataclass(frozen=True, slots=True)
class DlqRow:
    """A dead-letter entry without payload (from dlq_scan.lua)."""

    entry_id: str
    task_id: str
    queue: str
    task_type: str
    error_class: str
    failed_at_ms: int
    attempts_made: int

    @classmethod
    def decode_page(cls, reply: list[Any]) -> list[DlqRow]:
        """Decode dlq_scan.lua's flat reply: 7 values per entry (entry id, task id,
        queue, task type, error class, failed_at_ms, attempts_made)."""
        vals = [text(v) for v in reply]
        return [cls(vals[i], vals[i + 1], vals[i + 2], vals[i + 3], vals[i + 4],
                    as_int(vals[i + 5]), as_int(vals[i + 6]))
                for i in range(0, len(vals), 7)]


@dataclass(frozen=True, slots=True)
class DeadLetterReply:
    """requeue_dead_letter.lua's or discard_dead_letter.lua's reply, decoded (:meth:`of`).

    Attributes:
        status: ``OK``, ``NOT_FOUND``, ``NO_ENTRY``, ``WRONG_STATE``, ``MISMATCH`` or
            ``KEY_TAKEN``.
        at_ms: for OK, the time of the change (epoch ms, Redis TIME); else 0.
        detail: for WRONG_STATE the task's status, for KEY_TAKEN the live task id that
            holds the idempotency key; else "".
        became_busy: for a requeue's OK, whether this call set the queue's busy marker.
    """

    status: str
    at_ms: int = 0
    detail: str = ""
    became_busy: bool = False

    @classmethod
    def of(cls, reply: list[Any]) -> DeadLetterReply:
        """Decode ``{'OK', ts[, entry id, became_busy]}`` or ``{status[, detail]}``."""
        status = text(reply[0])
        if status == "OK":
            return cls(status, int(reply[1]),
                       became_busy=len(reply) > 3 and bool(int(reply[3])))
        return cls(status, detail=text(reply[1]) if len(reply) > 1 else "")


@dataclass(frozen=True, slots=True)
class DeadLetterEntry:
    """A full dead-letter entry (ListDeadLetters)."""

    entry_id: str
    fields: dict[str, bytes]


@dataclass(frozen=True, slots=True)
class RedriveFilter:
    """Which dead letters a redrive selects; empty strings / 0 match everything."""

    queue: str = ""
    task_type: str = ""
    error_class: str = ""
    min_age_ms: int = 0
    max_age_ms: int = 0

    def matches(self, row: DlqRow, now_ms: int) -> bool:
        """True when ``row`` passes every set filter (age from failed_at_ms)."""
        age = now_ms - (row.failed_at_ms or entry_ms(row.entry_id))
        return ((not self.queue or row.queue == self.queue)
                and (not self.task_type or row.task_type == self.task_type)
                and (not self.error_class or row.error_class == self.error_class)
                and age >= self.min_age_ms
                and (not self.max_age_ms or age <= self.max_age_ms))


@dataclass(slots=True)
class RedriveResult:
    """Outcome of a redrive."""

    matched: int = 0
    requeued: int = 0
    task_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class DlqSettings:
    """The settings dead-letter operations need."""

    audit_maxlen: int = 10000
    task_retention_s: int = 7 * 86400
    idem_ttl_s: int = 86400


async def dead_letter_queues(redis: Client) -> list[str]:
    """Queues that may have dead letters (members of ``dtq:queues:dead-letter``)."""
    return sorted(q for q in (text(m) for m in await redis.smembers(keys.DEAD_LETTER_QUEUES))
                  if keys.QUEUE_RE.match(q))


def _order(row_id: str, queue: str) -> tuple[int, int, str]:
    ms, _, seq = row_id.partition("-")
    return int(ms), int(seq or 0), queue


def parse_token(token: str, field_name: str = "page_token") -> tuple[str, str]:
    """``<entry id>`` or ``<entry id>/<queue>`` → (entry id, queue or "")."""
    entry_id, _, queue = token.partition("/")
    validate_page_token(entry_id, field_name)
    if queue and not keys.QUEUE_RE.match(queue):
        raise InvalidArgument(f"{field_name}: malformed page token", field=field_name)
    return entry_id, queue


def _bound(after: str, after_queue: str, queue: str, reverse: bool) -> str:
    """dlq_scan.lua's start id for ``queue`` when the page starts after (after,
    after_queue) in (entry id, queue) order: inclusive of ``after`` for queues that
    sort on the far side of ``after_queue``, exclusive otherwise."""
    if not after:
        return ""
    inclusive = (queue < after_queue) if reverse else (queue > after_queue)
    return ("=" if inclusive else "") + after


async def scan(redis: Client, reverse: bool, after: str = "", count: int = SCAN_PAGE,
               queues: list[str] | None = None, after_queue: str = "") -> list[DlqRow]:
    """One page of payload-free rows over the queues' dead-letter streams, newest first
    when ``reverse``, merged by (entry id, queue).

    Args:
        after: exclusive start entry id ("" = from the newest / oldest end).
        queues: the queues to read (default: every queue of the dead-letter index).
        after_queue: the queue of the ``after`` row (ties on the entry id).
    """
    queues = await dead_letter_queues(redis) if queues is None else queues
    if not queues:
        return []
    pipe = ScriptPipeline(redis)
    for q in queues:
        DLQ_SCAN.queue(pipe, [keys.dead_letter(q)], DLQ_SCAN.argv(
            "rev" if reverse else "fwd", _bound(after, after_queue, q, reverse), count))
    rows: list[DlqRow] = []
    for reply in await execute(redis, pipe):
        if isinstance(reply, Exception):
            raise reply
        rows += DlqRow.decode_page(reply)
    rows.sort(key=lambda r: _order(r.entry_id, r.queue), reverse=reverse)
    return rows[:count]


async def dead_letter_depth(redis: Client, queues: list[str] | None = None) -> dict[str, int]:
    """Dead-letter entries per queue (one XLEN per queue of the index, or of ``queues``)."""
    queues = await dead_letter_queues(redis) if queues is None else queues
    async with redis.pipeline(transaction=False) as pipe:
        for q in queues:
            pipe.xlen(keys.dead_letter(q))
        lengths = await pipe.execute()
    return {q: int(n) for q, n in zip(queues, lengths) if int(n)}


async def _entries(redis: Client, rows: list[DlqRow]) -> list[DeadLetterEntry]:
    async with redis.pipeline(transaction=False) as pipe:
        for row in rows:
            pipe.xrange(keys.dead_letter(row.queue), min=row.entry_id, max=row.entry_id)
        replies = await pipe.execute()
    return [DeadLetterEntry(text(r[0][0]), normalize(r[0][1])) for r in replies if r]


async def list_dead_letters(redis: Client, size: int, token: str = "",
                            queue: str = "") -> tuple[list[DeadLetterEntry], str]:
    """One page of dead letters, newest first: of one queue, or merged over every queue.

    Returns:
        The entries and the next page token ("" at the end).

    Raises:
        InvalidArgument: a malformed page token or queue name.
    """
    after, after_queue = parse_token(token)
    if queue:
        validate_queue(queue)
    rows = await scan(redis, True, after, size + 1, [queue] if queue else None, after_queue)
    page = await _entries(redis, rows[:size])
    if len(rows) > size:
        last = rows[size - 1]
        return page, f"{last.entry_id}/{last.queue}"
    return page, ""


def _raise_for(reply: DeadLetterReply, task_id: str) -> None:
    status = reply.status
    if status == "OK":
        return
    if status == "NOT_FOUND":
        raise NotFound(f"task {task_id} not found", reason="TASK_NOT_FOUND")
    if status == "NO_ENTRY":
        raise NotFound(f"task {task_id} has no dead-letter entry",
                       reason="DEAD_LETTER_NOT_FOUND")
    if status == "WRONG_STATE":
        raise WrongState(f"task {task_id} is {reply.detail}, not dead_lettered")
    if status == "KEY_TAKEN":
        raise WrongState(f"task {task_id} was not requeued: its idempotency key belongs to "
                         f"live task {reply.detail} (at most one live task per key; "
                         f"cancel that task first or enqueue a new task without the key)",
                         field="task_id", reason="IDEMPOTENCY_KEY_TAKEN")
    raise DtqError(f"requeue of task {task_id}: unexpected script reply {status}")


def _check_task_id(task_id: str) -> None:
    if not keys.TASK_ID_RE.match(task_id or ""):
        raise InvalidArgument("task_id: not a task id (32 lowercase hex characters and a "
                              "slot tag, as Enqueue returns it)", field="task_id")


async def requeue(redis: Client, task_id: str, call: CallInfo, cfg: DlqSettings, *,
                  action: str = "requeue_dead_letter", detail: str = "") -> int:
    """Put a dead-lettered task back in its band with a fresh attempt budget.

    Returns:
        The time of the requeue (epoch ms, Redis TIME).

    Raises:
        InvalidArgument, NotFound (no task / no dead-letter entry), WrongState.
    """
    _check_task_id(task_id)
    queue, priority, digest = await redis.hmget(keys.task(task_id), "queue", "priority",
                                                "idem_digest")
    if queue is None:
        raise NotFound(f"task {task_id} not found", reason="TASK_NOT_FOUND")
    queue_s, band = text(queue), as_int(priority)
    if not keys.QUEUE_RE.match(queue_s):
        raise NotFound(f"task {task_id} has no valid queue", reason="TASK_NOT_FOUND")
    keys_ = [keys.task(task_id), keys.dead_letter(queue_s), keys.stream(queue_s, band),
             keys.busy_marker(queue_s), keys.task(task_id)]
    if text(digest):
        keys_.append(keys.idempotency(queue_s, text(digest)))
    reply = DeadLetterReply.of(await REQUEUE_DEAD_LETTER(redis, keys_, REQUEUE_DEAD_LETTER.argv(
        cfg.audit_maxlen, call.actor, call.request_id, action, detail, queue_s, text(priority),
        cfg.task_retention_s, keys.GROUP, cfg.idem_ttl_s)))
    _raise_for(reply, task_id)
    if reply.became_busy:
        await mark_busy(redis, [queue_s])
    await append_audit(redis, call.actor, action, task_id, call.request_id, detail,
                       maxlen=cfg.audit_maxlen)
    return reply.at_ms


async def discard(redis: Client, task_id: str, call: CallInfo, cfg: DlqSettings) -> int:
    """Remove a task's dead-letter entry; the hash stays dead_lettered, discarded=1.

    Returns:
        The time of the discard (epoch ms).
    """
    _check_task_id(task_id)
    queue = text(await redis.hget(keys.task(task_id), "queue"))
    if not keys.QUEUE_RE.match(queue):
        raise NotFound(f"task {task_id} not found", reason="TASK_NOT_FOUND")
    reply = DeadLetterReply.of(await DISCARD_DEAD_LETTER(
        redis, [keys.task(task_id), keys.dead_letter(queue), keys.task(task_id)],
        DISCARD_DEAD_LETTER.argv(cfg.audit_maxlen, call.actor, call.request_id,
                                 cfg.task_retention_s)))
    _raise_for(reply, task_id)
    await append_audit(redis, call.actor, "discard_dead_letter", task_id, call.request_id, "",
                       maxlen=cfg.audit_maxlen)
    return reply.at_ms


async def purge(redis: Client, call: CallInfo, cfg: DlqSettings) -> int:
    """Remove every dead-letter entry (XTRIM MAXLEN = 0 of each queue's stream, one
    pipeline), then append one audit entry. Returns entries removed."""
    queues = await dead_letter_queues(redis)
    purged = 0
    if queues:
        async with redis.pipeline(transaction=False) as pipe:
            for q in queues:
                pipe.xtrim(keys.dead_letter(q), maxlen=0, approximate=False)
            purged = sum(int(n) for n in await pipe.execute())
    await append_audit(redis, call.actor, "purge_dead_letters", "", call.request_id,
                       f"purged={purged}", maxlen=cfg.audit_maxlen)
    return purged


async def select(redis: Client, flt: RedriveFilter, limit: int) -> list[DlqRow]:
    """Dead letters matching ``flt``, oldest first, at most ``limit``, one per task."""
    now = await redis_now_ms(redis)
    out: list[DlqRow] = []
    seen: set[str] = set()
    after, after_queue = "", ""
    queues = [flt.queue] if flt.queue else None
    while len(out) < limit:
        rows = await scan(redis, False, after, queues=queues, after_queue=after_queue)
        for row in rows:
            if row.task_id not in seen and flt.matches(row, now):
                seen.add(row.task_id)
                out.append(row)
                if len(out) == limit:
                    break
        if len(rows) < SCAN_PAGE:
            break
        after, after_queue = rows[-1].entry_id, rows[-1].queue
    return out


async def redrive(redis: Client, flt: RedriveFilter, call: CallInfo, cfg: DlqSettings, *,
                  dry_run: bool, max_per_second: int, limit: int) -> RedriveResult:
    """Requeue (or with ``dry_run`` only count) the dead letters matching ``flt``.

    Requeues are paced to ``max_per_second``. Each requeue is one atomic script
    with its own audit entry (action requeue_dead_letter, detail "redrive"); one
    summary entry (action redrive_dead_letters) follows. Tasks that cannot be
    requeued any more (record expired, already requeued) are skipped.
    """
    rows = await select(redis, flt, limit)
    result = RedriveResult(matched=len(rows),
                           task_ids=[r.task_id for r in rows[:REDRIVE_LIST_MAX]])
    if not dry_run:
        started = time.monotonic()
        for i, row in enumerate(rows):
            delay = started + i / max_per_second - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # rate limit, not synchronisation
            try:
                await requeue(redis, row.task_id, call, cfg, detail="redrive")
            except (NotFound, WrongState) as exc:
                log.info("redrive skipped task", extra={"task_id": row.task_id,
                                                        "reason": exc.reason})
                continue
            result.requeued += 1
    detail = json.dumps({"queue": flt.queue, "task_type": flt.task_type,
                         "error_class": flt.error_class, "min_age_ms": flt.min_age_ms,
                         "max_age_ms": flt.max_age_ms, "dry_run": dry_run,
                         "matched": result.matched, "requeued": result.requeued},
                        separators=(",", ":"))
    await append_audit(redis, call.actor, "redrive_dead_letters", "", call.request_id, detail,
                       maxlen=cfg.audit_maxlen)
    return result
