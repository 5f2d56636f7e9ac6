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

from dtq_gateway import observe
from dtq_gateway.duties.duty import PeriodicDuty
from dtq_gateway.duties.leader import LeaderLock
from dtq_gateway.settings import Settings
from dtq_gateway.store import groups, reaping
from dtq_gateway.store.client import Client

log = logging.getLogger(__name__)
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

    def __init__(self, redis: Client, settings: Settings, lock: LeaderLock) -> None:
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
        return await reaping.busy_queues(self._redis)

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
        now = time.monotonic()
        replies = await reaping.prune_consumers(
            self._redis, queues, int(self._settings.consumer_prune_idle_s * 1000))
        for q, reply in zip(queues, replies):
            self._pruned_at[q] = now
            if isinstance(reply, Exception):
                log.warning("reaper: prune_consumers failed: %r", reply, extra={"queue": q})
            elif reply:
                self.consumers_pruned += reply
                log.info("reaper: deleted %d consumers of gone workers", reply,
                         extra={"queue": q})

    async def _claim(self, queues: list[str], per_queue: dict[str, Counts]
                     ) -> tuple[list[reaping.Claimed], list[str]]:
        """One reap_queue.lua call per queue (one pipeline).

        Returns:
            (claimed entries, queues with unfinished scans).
        """
        self.queue_calls += len(queues)
        replies = await reaping.reap_queues(self._redis, queues, self._cursors,
                                            self._settings.visibility_timeout_ms,
                                            CLAIM_COUNT)
        claimed: list[reaping.Claimed] = []
        again: list[str] = []
        drained: list[str] = []
        for q, reply in zip(queues, replies):
            if isinstance(reply, Exception):
                log.error("reaper: reap_queue failed: %r", reply, extra={"queue": q})
                per_queue[q]["error"] += 1
                continue
            if reply.drained:
                per_queue[q]["drained"] += 1
                drained.append(q)
            if reply.deleted:
                per_queue[q]["deleted"] += reply.deleted
            claimed += reply.claimed
            if reply.cursors:
                self._cursors[q] = reply.cursors
                again.append(q)
            else:
                self._cursors.pop(q, None)
        await self.leave_busy_set(drained)
        return claimed, again

    async def leave_busy_set(self, queues: list[str]) -> None:
        """Remove drained queues (their busy markers just deleted) from the busy set,
        keeping those that became busy again meanwhile
        (:func:`dtq_gateway.store.reaping.leave_busy_set`)."""
        await reaping.leave_busy_set(self._redis, queues)

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
        busy = await reaping.busy_set(self._redis)
        listed = await reaping.dead_letter_index(self._redis)
        added, after = 0, ""
        while True:
            names = await reaping.registry_page(self._redis, after, page)
            if not names:
                return added
            markers = await reaping.queue_markers(self._redis, names)
            missing = [q for q, (marked, _) in zip(names, markers) if marked and q not in busy]
            unlisted = [q for q, (_, dead) in zip(names, markers) if dead and q not in listed]
            if unlisted:
                await reaping.add_to_dead_letter_index(self._redis, unlisted)
            if missing:
                await reaping.add_to_busy_set(self._redis, missing)
                added += len(missing)
                log.warning("busy set repaired: %d busy queues were missing", len(missing),
                            extra={"queues": missing[:20]})
            if len(names) < page:
                return added
            after = names[-1]

    async def _reclaim(self, claimed: list[reaping.Claimed],
                       per_queue: dict[str, Counts]) -> None:
        """Run reclaim.lua for each claimed entry (pipelines of RECLAIM_PER_PIPELINE)."""
        s = self._settings
        for start in range(0, len(claimed), RECLAIM_PER_PIPELINE):
            chunk = claimed[start:start + RECLAIM_PER_PIPELINE]
            replies = await reaping.reclaim(self._redis, chunk, s.dlq_maxlen,
                                            s.task_retention_s)
            for (queue, stream, _), reply in zip(chunk, replies):
                if isinstance(reply, Exception):
                    log.error("reaper: reclaim failed: %r", reply, extra={"stream": stream})
                    per_queue[queue]["error"] += 1
                else:
                    per_queue[queue][reply] += 1
