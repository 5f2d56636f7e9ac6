"""The reaper: reclaims leases whose worker went silent past the visibility timeout.

Runs on the scheduler leader only. Every tick it walks every band stream (found
with SCAN and cached for a few seconds) and asks ``autoclaim.lua`` for entries
idle longer than the visibility timeout; that script claims them to the reaper
consumer and acks away entries deleted while pending. Each claimed entry then goes
through ``reclaim.lua``, which re-checks that the reaper still owns it and applies
the rule of the lost attempt: it counts, so the task is retried as a new entry
while attempts remain and dead-lettered with ``LeaseExpired`` after the last one.

A reaper that crashes between the two scripts leaves the entries pending on the
reaper consumer; they become idle again and the next leader's reaper claims them
after one more visibility timeout, so nothing is lost. Two reapers (a leader
hand-over) are harmless: reclaim.lua is atomic and only acts on entries still
pending on the reaper consumer whose task still points at them.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from dtq_gateway import keys
from dtq_gateway.duty import PeriodicDuty
from dtq_gateway.leader import LeaderLock
from dtq_gateway.replies import text
from dtq_gateway.scripts import Script, execute
from dtq_gateway.settings import Settings

log = logging.getLogger(__name__)

_AUTOCLAIM = Script("autoclaim")
_RECLAIM = Script("reclaim")

#: Entries claimed per XAUTOCLAIM call.
CLAIM_COUNT = 100
#: XAUTOCLAIM calls per stream per tick; the cursor is kept for the next tick.
MAX_ROUNDS_PER_STREAM = 10
#: How long the SCAN result listing band streams is reused (s).
STREAMS_CACHE_S = 5.0


class Reaper(PeriodicDuty):
    """Reclaims expired leases on every band stream while this replica leads.

    Args:
        redis: client.
        settings: gateway settings (visibility timeout, DLQ MAXLEN, retention).
        lock: leadership; the reaper idles while it is not held.
    """

    name = "reaper"

    def __init__(self, redis: Redis, settings: Settings, lock: LeaderLock) -> None:
        super().__init__()
        self._redis = redis
        self._settings = settings
        self._lock = lock
        self._cursors: dict[str, str] = {}
        self._streams_cache: list[str] = []
        self._streams_at = float("-inf")
        #: Outcomes of reclaim.lua (and "deleted" for acked-away ids) since start.
        self.counts: collections.Counter[str] = collections.Counter()

    def interval_s(self) -> float:
        """A quarter of the visibility timeout, within [0.25, 5] s."""
        return min(5.0, max(0.25, self._settings.visibility_timeout_s / 4))

    def active(self) -> bool:
        """Only the scheduler leader reaps."""
        return self._lock.is_leader

    async def tick(self) -> None:
        """Reap every band stream once (bounded per stream)."""
        for stream in await self.band_streams():
            if self.stopping or not self._lock.is_leader:
                return
            await self.reap_stream(stream)

    async def band_streams(self) -> list[str]:
        """Every ``dtq:stream:<queue>:p<n>`` key.

        The SCAN result is reused for STREAMS_CACHE_S, or for one visibility timeout
        when that is shorter, so a new queue's leases are watched in time.
        """
        now = time.monotonic()
        if now - self._streams_at < min(STREAMS_CACHE_S, self._settings.visibility_timeout_s):
            return self._streams_cache
        found = set()
        async for key in self._redis.scan_iter(match=keys.BAND_STREAM_PATTERN, count=1000,
                                               _type="STREAM"):
            name = text(key)
            if keys.parse_stream(name) is not None:
                found.add(name)
        self._streams_cache, self._streams_at = sorted(found), now
        self._cursors = {s: c for s, c in self._cursors.items() if s in found}
        return self._streams_cache

    async def reap_stream(self, stream: str) -> collections.Counter[str]:
        """Claim and reclaim the expired entries of one band stream.

        Continues from the cursor a previous tick left when it hit the per-tick cap,
        so the scan of a long PEL always advances.

        Returns:
            Outcome counts of this call ("retried", "dead_lettered", "absorbed",
            "requeued", "cancelled", "not_owned", "deleted", "error").
        """
        counts: collections.Counter[str] = collections.Counter()
        cursor = self._cursors.pop(stream, "0-0")
        for _ in range(MAX_ROUNDS_PER_STREAM):
            try:
                reply = await _AUTOCLAIM(self._redis, [stream], _AUTOCLAIM.argv(
                    keys.GROUP, keys.REAPER_CONSUMER, self._settings.visibility_timeout_ms,
                    cursor, CLAIM_COUNT))
            except ResponseError as exc:
                if "NOGROUP" in str(exc):  # stream or group gone (FLUSHALL): nothing pending
                    return counts
                raise
            cursor, entries, deleted = text(reply[0]), reply[1], reply[2]
            if deleted:
                counts["deleted"] += len(deleted)
            if entries:
                counts.update(await self._reclaim(stream, entries))
            if cursor == "0-0":
                break
        else:
            self._cursors[stream] = cursor
        self.counts.update(counts)
        if counts:
            log.info("reaper: %s", dict(counts), extra={"stream": stream})
        return counts

    async def _reclaim(self, stream: str, entries: list[Any]) -> collections.Counter[str]:
        """Run reclaim.lua for each claimed entry (one pipeline)."""
        parsed = keys.parse_stream(stream)
        queue = parsed[0] if parsed else ""
        s = self._settings
        pipe = self._redis.pipeline(transaction=False)
        for entry_id, flat in entries:
            fields = {text(flat[i]): text(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}
            keys_ = [stream, keys.task(fields.get("task_id", "")), keys.DEAD_LETTER,
                     keys.CANCELLED]
            raw_idem = fields.get("idempotency_key", "")
            if raw_idem and queue:
                keys_.append(keys.idempotency(queue, keys.idempotency_digest(raw_idem)))
            _RECLAIM.queue(pipe, keys_, _RECLAIM.argv(
                text(entry_id), fields.get("attempt", "0"), s.dlq_maxlen, s.task_retention_s,
                keys.GROUP, keys.REAPER_CONSUMER))
        counts: collections.Counter[str] = collections.Counter()
        for reply in await execute(self._redis, pipe):
            if isinstance(reply, Exception):
                log.error("reaper: reclaim failed: %r", reply, extra={"stream": stream})
                counts["error"] += 1
            else:
                counts[text(reply)] += 1
        return counts
