"""Bulk cancels of waiting tasks: CancelTasks (by filter) and PurgeQueue.

A bulk cancel walks one queue's waiting work in bounded steps: each step is one
``cancel_matching.lua`` call that reads at most :data:`STEP` entries of one band stream
(p9 first) or of the queue's schedule from a cursor, and cancels the matching ones
with cancel.lua's semantics (a task a worker started is never touched; an entry a
lease read took a moment ago is left to activate.lua through the cancelled set). Each
step is atomic and touches the keys of one queue (one hash slot), so the walk is
cluster-safe and never holds Redis for more than one step; tasks enqueued behind the
cursor while the walk runs may be left. One audit entry per bulk call follows the
walk (the filter, matched and cancelled counts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from dtq_gateway.store import keys
from dtq_gateway.store.admin_common import CallInfo, redis_now_ms
from dtq_gateway.store.audit import append_audit
from dtq_gateway.store.client import Client
from dtq_gateway.store.replies import text
from dtq_gateway.store.scripts import Script

CANCEL_MATCHING = Script("cancel_matching", helpers=("_finished", "_concurrency"))
#: Entries one cancel_matching.lua call reads (bounds the time one step holds Redis).
STEP = 100
#: Most task ids a bulk cancel lists in its reply.
LIST_MAX = 1000


@dataclass(frozen=True, slots=True)
class CancelStep:
    """One cancel_matching.lua call's reply, decoded (:meth:`of`).

    Attributes:
        cursor: where the next step of the same target reads from.
        read: entries the step read (fewer than asked = the target is exhausted).
        matched: entries that matched the filter.
        cancelled: tasks cancelled outright.
        requested: active tasks flagged cancel_requested.
        task_ids: the matched tasks' ids.
    """

    cursor: str
    read: int
    matched: int
    cancelled: int
    requested: int
    task_ids: tuple[str, ...]

    @classmethod
    def of(cls, reply: list) -> CancelStep:
        """Decode ``{next cursor, read, matched, cancelled, requested, ids...}``."""
        return cls(text(reply[0]), int(reply[1]), int(reply[2]), int(reply[3]),
                   int(reply[4]), tuple(text(i) for i in reply[5:]))


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """A validated filter of waiting tasks (see TaskFilter in proto/dtq.proto)."""

    queue: str
    task_type: str = ""
    #: subset of {"queued", "scheduled", "active"}; empty = queued and scheduled (a
    #: started task only when "active" is asked for: it is then flagged
    #: cancel_requested, as CancelTask does)
    statuses: frozenset[str] = frozenset()
    metadata: dict[str, str] = field(default_factory=dict)
    min_age_ms: int = 0
    max_age_ms: int = 0
    created_after_ms: int = 0
    created_before_ms: int = 0

    def window(self, now_ms: int) -> tuple[int, int]:
        """(created at or after, created before) in epoch ms from the absolute bounds
        and the ages; 0 = unbounded."""
        after, before = self.created_after_ms, self.created_before_ms
        if self.max_age_ms:
            after = max(after, now_ms - self.max_age_ms)
        if self.min_age_ms:
            bound = now_ms - self.min_age_ms + 1
            before = min(before, bound) if before else bound
        return after, before

    def audit_detail(self) -> dict:
        """The filter as the audit entry records it."""
        return {"queue": self.queue, "task_type": self.task_type,
                "statuses": sorted(self.statuses), "metadata": self.metadata,
                "min_age_ms": self.min_age_ms, "max_age_ms": self.max_age_ms,
                "created_after_ms": self.created_after_ms,
                "created_before_ms": self.created_before_ms}


@dataclass(slots=True)
class BulkResult:
    """Outcome of a bulk cancel: tasks matched, tasks cancelled and active tasks flagged
    (0 with dry_run), the first :data:`LIST_MAX` matched ids."""

    matched: int = 0
    cancelled: int = 0
    #: active tasks flagged cancel_requested (0 with dry_run)
    requested: int = 0
    task_ids: list[str] = field(default_factory=list)


async def cancel_matching(redis: Client, flt: TaskFilter, *, dry_run: bool, limit: int,
                          task_retention_s: int, keep_finished: int = 0,
                          actor: str = "") -> BulkResult:
    """Cancel (or with ``dry_run`` count) up to ``limit`` waiting tasks of ``flt.queue``
    that match ``flt``: queued ones parked under a concurrency key first (key by key,
    oldest first), then queued (and, when asked, active) ones in their bands (p9 to p0,
    oldest entry first), then, unless ``dry_run``, the parked ones again (lease reads
    may park band tasks while the walk runs), then scheduled ones (soonest due first).
    Steps of :data:`STEP` entries, each one script call. Returns the counts; appends no
    audit entry (see :func:`bulk_cancel`).

    Parked tasks go first because cancelling a queued band task of a key moves one of
    the key's parked tasks to the tail of its band, where a band walk that already read
    the tail would miss it (docs/fairness.md)."""
    now = await redis_now_ms(redis)
    after, before = flt.window(now)
    meta = json.dumps(flt.metadata, separators=(",", ":")) if flt.metadata else "{}"
    q = flt.queue
    states = flt.statuses or frozenset({"queued", "scheduled"})
    in_bands = ",".join(s for s in ("queued", "active") if s in states)
    out = BulkResult()

    async def walk(targets: list[tuple[str, str]]) -> None:
        for kind, key in targets:
            await _walk_target(redis, out, kind, key, [
                q, kind, "", 0, "1" if dry_run else "0", flt.task_type, meta, after, before,
                task_retention_s, keep_finished, keys.GROUP, actor, in_bands],
                dry_run=dry_run, limit=limit)

    async def parked() -> list[tuple[str, str]]:
        if "queued" not in states:
            return []
        return [("parked", keys.concurrency_parked(q, text(k)))
                for k in sorted(await redis.hkeys(keys.concurrency_waiting(q)))]

    await walk(await parked())
    if in_bands:
        await walk([("stream", k) for k in keys.queue_streams_desc(q)])
        if not dry_run:
            await walk(await parked())
    if "scheduled" in states:
        await walk([("schedule", keys.schedule(q))])
    return out


async def _walk_target(redis: Client, out: BulkResult, kind: str, key: str, argv: list,
                       *, dry_run: bool, limit: int) -> None:
    """Step through one target (a band stream, a parked list or the schedule) with
    cancel_matching.lua, adding to ``out`` until it is exhausted or ``limit`` matched.
    ``argv``: the script's ARGV from ARGV[3] on; the cursor (ARGV[5]) and the step size
    (ARGV[6]) are filled in here."""
    q = argv[0]
    cursor = ""
    while out.matched < limit:
        step = min(STEP, limit - out.matched) if not dry_run else STEP
        argv[2], argv[3] = cursor, step
        reply = CancelStep.of(await CANCEL_MATCHING(redis, [
            key, keys.cancelled(q), keys.expiring(q), keys.finished(q),
            keys.queue_counters(q)], Script.argv(*argv)))
        cursor, read, matched = reply.cursor, reply.read, reply.matched
        out.requested += reply.requested
        ids = list(reply.task_ids)
        if dry_run and out.matched + matched > limit:
            matched, ids = limit - out.matched, ids[:limit - out.matched]
        out.matched += matched
        out.cancelled += reply.cancelled
        out.task_ids += ids[:max(0, LIST_MAX - len(out.task_ids))]
        if read < step:
            break


async def bulk_cancel(redis: Client, flt: TaskFilter, call: CallInfo, *, action: str,
                      dry_run: bool, limit: int, reason: str, task_retention_s: int,
                      keep_finished: int, audit_maxlen: int) -> BulkResult:
    """:func:`cancel_matching`, then one audit entry (``action``: cancel_tasks or
    purge_queue; target the queue; detail the filter, dry_run, counts and reason)."""
    out = await cancel_matching(redis, flt, dry_run=dry_run, limit=limit,
                                task_retention_s=task_retention_s,
                                keep_finished=keep_finished, actor=call.actor)
    detail = json.dumps({**flt.audit_detail(), "dry_run": dry_run, "matched": out.matched,
                         "cancelled": out.cancelled, "cancel_requested": out.requested,
                         "reason": reason},
                        separators=(",", ":"))
    await append_audit(redis, call.actor, action, flt.queue, call.request_id, detail,
                       maxlen=audit_maxlen)
    return out
