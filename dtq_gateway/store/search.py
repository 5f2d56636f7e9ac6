"""SearchTasks: tasks by type, status, metadata and time range, paged.

The index is the recent-tasks index ``dtq:tasks:recent`` (a zset of task ids scored by
their enqueue time, epoch ms; written in the enqueue's own index pipeline and trimmed
to DTQ_RECENT_MAX), so searching adds no write to any task's path. A time range is a
range of that index (ZRANGE BYSCORE REV); the other filters are checked on the task
records of the range, newest first. The cost is bounded per page: a page reads at most
:data:`EXAMINE_MAX` index entries and their records (one pipeline of one script call
per hash slot per :data:`CHUNK` entries) whatever the match rate, and says where it
stopped (``next_page_token``), so a rare match may take several pages. A search sees
the newest DTQ_RECENT_MAX tasks of all queues.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, cast

from dtq_gateway.errors import InvalidArgument
from dtq_gateway.store import keys
from dtq_gateway.store.admin_lists import task_summaries
from dtq_gateway.store.client import Client
from dtq_gateway.store.replies import text

#: Most index entries (and task records) one page reads.
EXAMINE_MAX = 1000
#: Index entries read per round trip.
CHUNK = 200


@dataclass(frozen=True, slots=True)
class SearchFilter:
    """A validated search filter (TaskFilter in proto/dtq.proto); empty = any."""

    queue: str = ""
    task_type: str = ""
    #: hash status strings ("queued", "succeeded", ...); empty = any
    statuses: frozenset[str] = frozenset()
    metadata: dict[str, str] = field(default_factory=dict)
    #: enqueued at or after / before (epoch ms; 0 = unbounded)
    after_ms: int = 0
    before_ms: int = 0

    def matches(self, f: dict) -> bool:
        """True when the task record ``f`` (task_summaries row) passes the filter."""
        if not f:
            return False
        if self.queue and text(f.get("queue")) != self.queue:
            return False
        if self.task_type and text(f.get("task_type")) != self.task_type:
            return False
        if self.statuses and text(f.get("status")) not in self.statuses:
            return False
        if self.metadata:
            try:
                meta = json.loads(text(f.get("metadata")) or "{}")
            except ValueError:
                return False
            if not isinstance(meta, dict) or any(
                    meta.get(k) != v for k, v in self.metadata.items()):
                return False
        return True


def parse_token(token: str) -> str:
    """The task id a page token names ("" for ""); INVALID_ARGUMENT (field
    page_token) for anything else."""
    if token and not keys.TASK_ID_RE.match(token):
        raise InvalidArgument("page_token: not a token of this search", field="page_token")
    return token


async def search(redis: Client, flt: SearchFilter, size: int, token: str = ""
                 ) -> tuple[list[dict], str, int]:
    """One page: up to ``size`` matching task records (payload omitted), newest first.

    The page token is the id of the last entry examined; the next page starts right
    after its current rank (ZREVRANK), so ties of one millisecond (an EnqueueBatch)
    are neither skipped nor repeated. A token whose task left the index (trimmed, so
    everything older left too) ends the search.

    Returns:
        (records, next page token or "" when the range is exhausted, entries examined).

    Raises:
        InvalidArgument: a malformed ``token``.
    """
    after = parse_token(token)
    start: int
    if after:
        rank = await redis.zrevrank(keys.RECENT_TASKS, after)
        if rank is None:
            return [], "", 0
        start = cast(int, rank) + 1  # ZREVRANK without WITHSCORE: the rank
    else:
        start = (await redis.zcount(keys.RECENT_TASKS, flt.before_ms, "+inf")
                 if flt.before_ms else 0)
    out: list[dict] = []
    examined = 0
    last = ""
    while examined < EXAMINE_MAX:
        want = min(CHUNK, EXAMINE_MAX - examined)
        rows: list[Any] = await redis.zrevrange(keys.RECENT_TASKS, start, start + want - 1,
                                     withscores=True)
        if flt.after_ms:
            rows = [(m, s) for m, s in rows if int(s) >= flt.after_ms]
        if not rows:
            return out, "", examined
        start += len(rows)
        ids = [text(m) for m, _ in rows]
        for task_id, rec in zip(ids, await task_summaries(redis, ids)):
            examined += 1
            last = task_id
            if flt.matches(rec):
                out.append(rec)
                if len(out) == size:
                    return out, last, examined
        if len(rows) < want:
            return out, "", examined
    return out, last, examined
