"""Dead-letter administration: list, requeue, discard, purge and filtered redrive.

Each state change is one Lua script that also appends its audit entry
(``lua/requeue_dead_letter.lua``, ``discard_dead_letter.lua``,
``purge_dead_letters.lua``). Scans over the dead-letter stream use
``lua/dlq_scan.lua``, which returns entries without their payloads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

from redis.asyncio import Redis

from dtq_gateway import keys
from dtq_gateway.admin import (
    CallInfo,
    as_int,
    entry_ms,
    redis_now_ms,
    text,
    validate_page_token,
    validate_queue,
)
from dtq_gateway.admin_scripts import (
    DISCARD_DEAD_LETTER,
    DLQ_SCAN,
    PURGE_DEAD_LETTERS,
    REQUEUE_DEAD_LETTER,
)
from dtq_gateway.audit import append_audit, log_audit
from dtq_gateway.errors import DtqError, InvalidArgument, NotFound, WrongState
from dtq_gateway.task_record import normalize

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


async def scan(redis: Redis, reverse: bool, after: str = "",
               count: int = SCAN_PAGE) -> list[DlqRow]:
    """One page of payload-free rows, newest first when ``reverse``.

    Args:
        after: exclusive start entry id ("" = from the newest / oldest end).
    """
    flat = await DLQ_SCAN(redis, [keys.DEAD_LETTER], DLQ_SCAN.argv(
        "rev" if reverse else "fwd", after, count))
    vals = [text(v) for v in flat]
    return [DlqRow(vals[i], vals[i + 1], vals[i + 2], vals[i + 3], vals[i + 4],
                   as_int(vals[i + 5]), as_int(vals[i + 6])) for i in range(0, len(vals), 7)]


async def dead_letter_depth(redis: Redis) -> dict[str, int]:
    """Dead-letter entries per original queue (scans the whole, bounded, stream)."""
    counts: dict[str, int] = {}
    after = ""
    while True:
        rows = await scan(redis, False, after)
        for row in rows:
            counts[row.queue] = counts.get(row.queue, 0) + 1
        if len(rows) < SCAN_PAGE:
            return counts
        after = rows[-1].entry_id


async def _entries(redis: Redis, ids: list[str]) -> list[DeadLetterEntry]:
    async with redis.pipeline(transaction=False) as pipe:
        for entry_id in ids:
            pipe.xrange(keys.DEAD_LETTER, min=entry_id, max=entry_id)
        replies = await pipe.execute()
    return [DeadLetterEntry(text(r[0][0]), normalize(r[0][1])) for r in replies if r]


async def list_dead_letters(redis: Redis, size: int, token: str = "",
                            queue: str = "") -> tuple[list[DeadLetterEntry], str]:
    """One page of the dead-letter stream, newest first.

    With a queue filter at most :data:`LIST_SCAN_MAX` entries are examined per
    call; a page may then hold fewer than ``size`` entries and still carry a
    next page token.

    Returns:
        The entries and the next page token ("" at the end).
    """
    validate_page_token(token)
    if queue:
        validate_queue(queue)
    else:
        rows = await redis.xrevrange(keys.DEAD_LETTER, max=f"({token}" if token else "+",
                                     min="-", count=size + 1)
        page = [DeadLetterEntry(text(i), normalize(f)) for i, f in rows[:size]]
        return page, (page[-1].entry_id if len(rows) > size else "")
    matched: list[str] = []
    after, scanned = token, 0
    while len(matched) <= size and scanned < LIST_SCAN_MAX:
        rows = await scan(redis, True, after)
        scanned += len(rows)
        matched.extend(r.entry_id for r in rows if r.queue == queue)
        if len(rows) < SCAN_PAGE:
            after = ""
            break
        after = rows[-1].entry_id
    page = await _entries(redis, matched[:size])
    if len(matched) > size:
        return page, matched[size - 1]
    return page, after  # "" when the stream end was reached, else where the scan stopped


def _raise_for(reply: list[object], task_id: str) -> None:
    status = text(reply[0])
    if status == "OK":
        return
    if status == "NOT_FOUND":
        raise NotFound(f"task {task_id} not found", reason="TASK_NOT_FOUND")
    if status == "NO_ENTRY":
        raise NotFound(f"task {task_id} has no dead-letter entry",
                       reason="DEAD_LETTER_NOT_FOUND")
    if status == "WRONG_STATE":
        raise WrongState(f"task {task_id} is {text(reply[1])}, not dead_lettered")
    if status == "KEY_TAKEN":
        raise WrongState(f"task {task_id} was not requeued: its idempotency key belongs to "
                         f"live task {text(reply[1])} (at most one live task per key; "
                         f"cancel that task first or enqueue a new task without the key)",
                         field="task_id", reason="IDEMPOTENCY_KEY_TAKEN")
    raise DtqError(f"requeue of task {task_id}: unexpected script reply {status}")


def _check_task_id(task_id: str) -> None:
    if not keys.TASK_ID_RE.match(task_id or ""):
        raise InvalidArgument("task_id: must be 32 lowercase hex characters", field="task_id")


async def requeue(redis: Redis, task_id: str, call: CallInfo, cfg: DlqSettings, *,
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
    keys_ = [keys.task(task_id), keys.DEAD_LETTER, keys.stream(queue_s, band), keys.AUDIT,
             keys.BUSY_QUEUES]
    if text(digest):
        keys_.append(keys.idempotency(queue_s, text(digest)))
    reply = await REQUEUE_DEAD_LETTER(redis, keys_, REQUEUE_DEAD_LETTER.argv(
        cfg.audit_maxlen, call.actor, call.request_id, action, detail, queue_s, text(priority),
        cfg.task_retention_s, keys.GROUP, cfg.idem_ttl_s))
    _raise_for(reply, task_id)
    log_audit(call.actor, action, task_id, call.request_id, detail, int(reply[1]))
    return int(reply[1])


async def discard(redis: Redis, task_id: str, call: CallInfo, cfg: DlqSettings) -> int:
    """Remove a task's dead-letter entry; the hash stays dead_lettered, discarded=1.

    Returns:
        The time of the discard (epoch ms).
    """
    _check_task_id(task_id)
    reply = await DISCARD_DEAD_LETTER(redis, [keys.task(task_id), keys.DEAD_LETTER, keys.AUDIT],
                                      DISCARD_DEAD_LETTER.argv(cfg.audit_maxlen, call.actor,
                                                               call.request_id,
                                                               cfg.task_retention_s))
    _raise_for(reply, task_id)
    log_audit(call.actor, "discard_dead_letter", task_id, call.request_id, "", int(reply[1]))
    return int(reply[1])


async def purge(redis: Redis, call: CallInfo, cfg: DlqSettings) -> int:
    """Remove every dead-letter entry (XTRIM MAXLEN = 0). Returns entries removed."""
    purged, ts = await PURGE_DEAD_LETTERS(redis, [keys.DEAD_LETTER, keys.AUDIT],
                                          PURGE_DEAD_LETTERS.argv(cfg.audit_maxlen, call.actor,
                                                                  call.request_id))
    log_audit(call.actor, "purge_dead_letters", "", call.request_id, f"purged={purged}", int(ts))
    return int(purged)


async def select(redis: Redis, flt: RedriveFilter, limit: int) -> list[DlqRow]:
    """Dead letters matching ``flt``, oldest first, at most ``limit``, one per task."""
    now = await redis_now_ms(redis)
    out: list[DlqRow] = []
    seen: set[str] = set()
    after = ""
    while len(out) < limit:
        rows = await scan(redis, False, after)
        for row in rows:
            if row.task_id not in seen and flt.matches(row, now):
                seen.add(row.task_id)
                out.append(row)
                if len(out) == limit:
                    break
        if len(rows) < SCAN_PAGE:
            break
        after = rows[-1].entry_id
    return out


async def redrive(redis: Redis, flt: RedriveFilter, call: CallInfo, cfg: DlqSettings, *,
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
