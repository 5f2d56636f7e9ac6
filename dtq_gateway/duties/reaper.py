"""The reaper: reclaims leases whose worker went silent past the visibility timeout.

Runs on the scheduler leader only. Every tick it reads the busy-queue set
(``dtq:queues:busy``: queues whose band streams may hold entries) and runs
``reap_queue.lua`` once per busy queue, pipelined across queues. That script skips
empty streams (one XLEN each), claims entries idle longer than the visibility timeout
to the reaper consumer, acks away entries deleted while pending, and takes the queue
out of the busy set once its ten streams are empty. A tick therefore costs in
proportion to the busy queues, never to the queues that were ever used.

Each claimed entry then goes through ``reclaim.lua`` (one pipeline for the whole
tick), which re-checks that the reaper still owns it and applies the rule of the lost
attempt: it counts, so the task is retried as a new entry while attempts remain and
dead-lettered with ``LeaseExpired`` after the last one.

A reaper that crashes between the two scripts leaves the entries pending on the
reaper consumer; they become idle again and the next leader's reaper claims them
after one more visibility timeout, so nothing is lost (their stream is not empty, so
the queue stays in the busy set). Two reapers (a leader hand-over) are harmless:
reclaim.lua is atomic and only acts on entries still pending on the reaper consumer
whose task still points at them.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any

from redis.asyncio import Redis

from dtq_gateway import observe
from dtq_gateway.duties.duty import PeriodicDuty
from dtq_gateway.duties.leader import LeaderLock
from dtq_gateway.settings import Settings
from dtq_gateway.store import groups, keys
from dtq_gateway.store.replies import text
from dtq_gateway.store.scripts import Script, execute

log = logging.getLogger(__name__)

_REAP_QUEUE = Script("reap_queue")
_RECLAIM = Script("reclaim")
_PRUNE_CONSUMERS = Script("prune_consumers")
#: How often one busy queue's consumers are pruned (s, or DTQ_CONSUMER_PRUNE_IDLE_S when
#: shorter); a queue that drains is pruned once more DTQ_CONSUMER_PRUNE_IDLE_S later.
PRUNE_EVERY_S = 60.0

#: How often the leader checks every registered queue's busy marker against the busy set
#: (s); see :meth:`Reaper.repair_busy_set`.
REPAIR_EVERY_S = 3600.0

#: Entries claimed per stream per reap_queue.lua call.
CLAIM_COUNT = 100
#: reap_queue.lua calls per queue per tick; unfinished PEL scans continue next tick.
MAX_ROUNDS_PER_QUEUE = 10
#: reap_queue.lua calls per pipeline (busy queues are reaped in batches of this size).
QUEUES_PER_PIPELINE = 200
#: reclaim.lua calls per pipeline.
RECLAIM_PER_PIPELINE = 500

Counts = collections.Counter[str]


class Reaper(PeriodicDuty):
    """Reclaims expired leases of every busy queue while this replica leads.

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
        #: queue -> {stream index 1..10: XAUTOCLAIM cursor} of PEL scans left unfinished
        self._cursors: dict[str, dict[int, str]] = {}
        self._registry_checked = False
        #: next busy-set repair (monotonic s): at the first tick, then every REPAIR_EVERY_S
        self._repair_at = 0.0
        #: Outcomes of reclaim.lua ("deleted" for acked-away ids, "drained" for queues
        #: that left the busy set) since start.
        self.counts: Counts = collections.Counter()
        #: reap_queue.lua calls since start (what a tick costs: one per busy queue).
        self.queue_calls = 0
        #: no reclaim before this time (monotonic s), see :meth:`hold`
        self._hold_until = 0.0
        #: busy queue -> when its consumers were last pruned (monotonic s)
        self._pruned_at: dict[str, float] = {}
        #: drained queue -> when to prune its consumers once more (monotonic s)
        self._prune_later: dict[str, float] = {}
        #: consumers deleted by prune_consumers.lua since start
        self.consumers_pruned = 0

    def hold(self) -> None:
        """Reclaim nothing for one visibility timeout from now.

        Called when leadership starts and when Redis is reachable again after failed
        ticks: leases can then look expired only because their workers could not reach a
        gateway or Redis to heartbeat (a gateway restart, an outage), and a live worker
        gets one visibility timeout to heartbeat before its lease is reclaimed. A lease
        whose worker is really gone is reclaimed at most one visibility timeout later.
        """
        self._hold_until = time.monotonic() + self._settings.visibility_timeout_s

    def leadership_started(self) -> None:
        """Check the registry marker again at the next tick (one EXISTS per leadership),
        and :meth:`hold` reclaims for one visibility timeout."""
        self._registry_checked = False
        self._repair_at = 0.0
        self.hold()

    def interval_s(self) -> float:
        """A quarter of the visibility timeout, within [0.25, 5] s."""
        return min(5.0, max(0.25, self._settings.visibility_timeout_s / 4))

    def active(self) -> bool:
        """Only the scheduler leader reaps, and not while it holds (see :meth:`hold`);
        the busy-set repair due at the start of a leadership runs during the hold."""
        return self._lock.is_leader and (time.monotonic() >= self._hold_until
                                         or time.monotonic() >= self._repair_at)

    async def tick(self) -> None:
        """Reap every busy queue once (bounded per queue); the first tick after failed
        ones (Redis unreachable) only starts a :meth:`hold`."""
        if self.failures:
            self.hold()
            return
        if not self._registry_checked:
            await groups.backfill_registry(self._redis)
            self._registry_checked = True
        if time.monotonic() >= self._repair_at:
            self._repair_at = time.monotonic() + REPAIR_EVERY_S
            await self.repair_busy_set()
        if time.monotonic() < self._hold_until:
            return
        busy = await self.busy_queues()
        self._cursors = {q: c for q, c in self._cursors.items() if q in busy}
        self._pruned_at = {q: t for q, t in self._pruned_at.items() if q in busy}
        now = time.monotonic()
        due = [q for q, at in self._prune_later.items() if at <= now]
        for q in due:
            del self._prune_later[q]
        await self._prune(due)
        for start in range(0, len(busy), QUEUES_PER_PIPELINE):
            if self.stopping or not self._lock.is_leader:
                return
            await self.reap_queues(busy[start:start + QUEUES_PER_PIPELINE])

    async def busy_queues(self) -> list[str]:
        """Members of ``dtq:queues:busy`` (valid queue names only), sorted."""
        found = {text(m) async for m in self._redis.sscan_iter(keys.BUSY_QUEUES, count=1000)}
        return sorted(q for q in found if keys.QUEUE_RE.match(q))

    async def reap_queue(self, queue: str) -> Counts:
        """Reap one queue; returns its outcome counts (see :meth:`reap_queues`)."""
        return (await self.reap_queues([queue])).get(queue, collections.Counter())

    async def reap_queues(self, queues: list[str]) -> dict[str, Counts]:
        """Claim and reclaim the expired entries of some busy queues.

        Each round is one pipeline of reap_queue.lua calls and one of reclaim.lua calls.
        A queue whose PEL scan did not wrap around gets another round (up to
        MAX_ROUNDS_PER_QUEUE); what is left continues from the saved cursors next tick.

        Returns:
            Per queue, outcome counts ("retried", "dead_lettered", "absorbed",
            "requeued", "cancelled", "not_owned", "deleted", "drained", "error").
        """
        per_queue: dict[str, Counts] = collections.defaultdict(collections.Counter)
        todo = list(queues)
        for _ in range(MAX_ROUNDS_PER_QUEUE):
            if not todo:
                break
            claimed, todo = await self._claim(todo, per_queue)
            if claimed:
                await self._reclaim(claimed, per_queue)
        now = time.monotonic()
        idle_s = self._settings.consumer_prune_idle_s
        for q in queues:
            if per_queue[q]["drained"]:  # its workers' consumers go idle from now on
                self._prune_later[q] = now + idle_s
        await self._prune([q for q in queues if not per_queue[q]["drained"]
                           and now - self._pruned_at.setdefault(q, now)
                           >= min(PRUNE_EVERY_S, idle_s)])
        for queue, counts in per_queue.items():
            self.counts.update(counts)
            observe.reaped(queue, counts)
            if set(counts) - {"drained"}:
                log.info("reaper: %s", dict(counts), extra={"queue": queue})
        return dict(per_queue)

    async def _prune(self, queues: list[str]) -> None:
        """Delete the consumers of gone workers in these queues (one pipeline): no
        pending entry, no read for DTQ_CONSUMER_PRUNE_IDLE_S."""
        if not queues:
            return
        pipe = self._redis.pipeline(transaction=False)
        for q in queues:
            _PRUNE_CONSUMERS.queue(pipe, keys.queue_streams_desc(q), _PRUNE_CONSUMERS.argv(
                keys.GROUP, int(self._settings.consumer_prune_idle_s * 1000),
                keys.REAPER_CONSUMER))
        now = time.monotonic()
        for q, reply in zip(queues, await execute(self._redis, pipe)):
            self._pruned_at[q] = now
            if isinstance(reply, Exception):
                log.warning("reaper: prune_consumers failed: %r", reply, extra={"queue": q})
            elif int(reply):
                self.consumers_pruned += int(reply)
                log.info("reaper: deleted %d consumers of gone workers", int(reply),
                         extra={"queue": q})

    async def _claim(self, queues: list[str], per_queue: dict[str, Counts]
                     ) -> tuple[list[tuple[str, str, Any]], list[str]]:
        """One reap_queue.lua call per queue (one pipeline).

        Returns:
            (claimed entries as (queue, stream, entry), queues with unfinished scans).
        """
        s = self._settings
        pipe = self._redis.pipeline(transaction=False)
        for q in queues:
            cursors = self._cursors.get(q, {})
            _REAP_QUEUE.queue(pipe, [*keys.queue_streams_desc(q), keys.busy_marker(q),
                                     keys.schedule(q)],
                              _REAP_QUEUE.argv(keys.GROUP, keys.REAPER_CONSUMER,
                                               s.visibility_timeout_ms, CLAIM_COUNT, q,
                                               *(cursors.get(i, "0-0") for i in range(1, 11))))
        self.queue_calls += len(queues)
        claimed: list[tuple[str, str, Any]] = []
        again: list[str] = []
        drained: list[str] = []
        for q, reply in zip(queues, await execute(self._redis, pipe)):
            if isinstance(reply, Exception):
                log.error("reaper: reap_queue failed: %r", reply, extra={"queue": q})
                per_queue[q]["error"] += 1
                continue
            if int(reply[0]) == 1:
                per_queue[q]["drained"] += 1
                drained.append(q)
            streams = keys.queue_streams_desc(q)
            cursors: dict[int, str] = {}
            for index, cursor, entries, deleted in reply[1:]:
                stream = streams[int(index) - 1]
                if deleted:
                    per_queue[q]["deleted"] += len(deleted)
                claimed += [(q, stream, e) for e in entries]
                if text(cursor) != "0-0":
                    cursors[int(index)] = text(cursor)
            if cursors:
                self._cursors[q] = cursors
                again.append(q)
            else:
                self._cursors.pop(q, None)
        await self.leave_busy_set(drained)
        return claimed, again

    async def leave_busy_set(self, queues: list[str]) -> None:
        """Remove drained queues (their busy markers just deleted) from the busy set.

        The busy set spans queues, so this is a single-key SREM after the queue's
        script, then a re-read of the markers: a queue that became busy again in
        between (its enqueue set the marker; the SADD that follows it may have landed
        before this SREM) is added back. Every interleaving leaves a busy queue in
        the set: an enqueue that set the marker before the re-read is seen by it, one
        after it does its own SADD after this SREM."""
        if not queues:
            return
        await self._redis.srem(keys.BUSY_QUEUES, *queues)
        pipe = self._redis.pipeline(transaction=False)
        for q in queues:
            pipe.exists(keys.busy_marker(q))
        again = [q for q, n in zip(queues, await pipe.execute()) if int(n)]
        if again:
            await self._redis.sadd(keys.BUSY_QUEUES, *again)

    async def repair_busy_set(self, page: int = 1000) -> int:
        """Add every queue whose busy marker is set to the busy set, and every queue with
        dead letters to the dead-letter index; returns how many busy queues were missing.

        Repairs the one gap of the two-step bookkeeping of these cross-queue sets: a
        gateway that died (or a SADD refused during a failover) between a script and
        its SADD. Runs at the start of each leadership and every REPAIR_EVERY_S: both
        sets are read once, then the registry ``dtq:queues`` is paged through with two
        reads per queue (EXISTS of the marker and of the dead-letter stream),
        pipelined ``page`` queues at a time.
        """
        busy = {text(m) async for m in self._redis.sscan_iter(keys.BUSY_QUEUES, count=1000)}
        listed = {text(m) for m in await self._redis.smembers(keys.DEAD_LETTER_QUEUES)}
        added, start = 0, "-"
        while True:
            names = [text(n) for n in await self._redis.zrangebylex(
                keys.QUEUES, start, "+", start=0, num=page)]
            if not names:
                return added
            pipe = self._redis.pipeline(transaction=False)
            for q in names:
                pipe.exists(keys.busy_marker(q))
                pipe.exists(keys.dead_letter(q))
            replies = [int(r) for r in await pipe.execute()]
            missing = [q for i, q in enumerate(names) if replies[2 * i] and q not in busy]
            unlisted = [q for i, q in enumerate(names) if replies[2 * i + 1] and q not in listed]
            if unlisted:
                await self._redis.sadd(keys.DEAD_LETTER_QUEUES, *unlisted)
            if missing:
                await self._redis.sadd(keys.BUSY_QUEUES, *missing)
                added += len(missing)
                log.warning("busy set repaired: %d busy queues were missing", len(missing),
                            extra={"queues": missing[:20]})
            if len(names) < page:
                return added
            start = f"({names[-1]}"

    async def _reclaim(self, claimed: list[tuple[str, str, Any]],
                       per_queue: dict[str, Counts]) -> None:
        """Run reclaim.lua for each claimed entry (pipelines of RECLAIM_PER_PIPELINE)."""
        s = self._settings
        for start in range(0, len(claimed), RECLAIM_PER_PIPELINE):
            chunk = claimed[start:start + RECLAIM_PER_PIPELINE]
            pipe = self._redis.pipeline(transaction=False)
            # a reclaim may dead-letter: the queue joins the dead-letter index first
            pipe.sadd(keys.DEAD_LETTER_QUEUES, *{queue for queue, _, _ in chunk})
            for queue, stream, (entry_id, flat) in chunk:
                fields = {text(flat[i]): text(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}
                keys_ = [stream, keys.task(fields.get("task_id", "")), keys.dead_letter(queue),
                         keys.cancelled(queue)]
                raw_idem = fields.get("idempotency_key", "")
                if raw_idem:
                    keys_.append(keys.idempotency(queue, keys.idempotency_digest(raw_idem)))
                _RECLAIM.queue(pipe, keys_, _RECLAIM.argv(
                    text(entry_id), fields.get("attempt", "0"), s.dlq_maxlen,
                    s.task_retention_s, keys.GROUP, keys.REAPER_CONSUMER))
            replies = await execute(self._redis, pipe)
            for (queue, stream, _), reply in zip(chunk, replies[1:]):
                if isinstance(reply, Exception):
                    log.error("reaper: reclaim failed: %r", reply, extra={"stream": stream})
                    per_queue[queue]["error"] += 1
                else:
                    per_queue[queue][text(reply)] += 1
