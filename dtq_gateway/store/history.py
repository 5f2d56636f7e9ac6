"""Queue history: one sample per queue per minute in a capped Redis list.

The scheduler leader (:class:`~dtq_gateway.duties.history.HistorySampler`) takes one
sample every ``DTQ_HISTORY_INTERVAL_S`` from what Redis already holds, so the hot
path (Enqueue, Ack, Fail) gets **no extra command**:

* outcome counters ``dtq:queue:{<q>}:counters``: ``history_counters.lua`` returns how
  much they grew since the previous sample and stores the new baseline in the same
  hash (``h_succeeded``, ``h_retried``, ``h_dead_lettered``), so each sample holds the
  succeeded, failed (= retried + dead-lettered attempts) and dead-lettered attempts of
  its window, exactly, whichever replica took the one before;
* depth and backlog age of the band streams (as GetQueueStats reads them);
* the tasks created since the previous sample, from the recent-tasks index
  ``dtq:tasks:recent`` (at most :data:`SAMPLE_MAX` of them read): how many were
  enqueued (overall: exact, ZCOUNT; per queue: counted in the tasks read, scaled up
  when the minute held more than :data:`SAMPLE_MAX`), and the queue wait
  (started - max(created, not before)) and run time (finished - started) of those
  that started or finished by the time of the sample, as p50 / p95 / p99.

Each sample is a JSON object pushed onto ``dtq:history:{<queue>}`` (per queue, in the
queue's slot) and ``dtq:history`` (all queues together): LPUSH, LTRIM to
``DTQ_HISTORY_POINTS`` and PEXPIRE ``points × interval``, so a list holds at most
``DTQ_HISTORY_POINTS`` samples and a queue that stops being sampled loses its list.
Every gateway reads the same lists, and they outlive any gateway.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from dtq_gateway.store import keys
from dtq_gateway.store.admin import band_infos_many
from dtq_gateway.store.admin_common import as_int
from dtq_gateway.store.client import Client
from dtq_gateway.store.replies import text
from dtq_gateway.store.scripts import Script, ScriptPipeline, execute

#: Most task records read per sample (the newest of the tasks created since the last one).
SAMPLE_MAX = 1000
#: Most queues sampled per tick (the busy ones, by name); more are left out.
MAX_QUEUES = 200
HISTORY_COUNTERS = Script("history_counters")
#: Task records read per pipeline.
_CHUNK = 500


def percentiles(values: list[int]) -> list[int]:
    """[p50, p95, p99] of ``values`` (nearest rank; [] when there are none)."""
    if not values:
        return []
    v = sorted(values)
    return [v[min(len(v) - 1, max(0, -(-len(v) * p // 100) - 1))] for p in (50, 95, 99)]


@dataclass(frozen=True, slots=True)
class OutcomeDeltas:
    """history_counters.lua's reply, decoded (:meth:`of`): outcomes of one queue since
    its previous history sample (all 0 for a failed call or a queue without counters)."""

    succeeded: int = 0
    retried: int = 0
    dead_lettered: int = 0

    @classmethod
    def of(cls, reply: Any) -> OutcomeDeltas:
        """Decode ``{succeeded, retried, dead_lettered}``; an exception (the call failed
        in its pipeline) decodes as all 0."""
        if isinstance(reply, Exception):
            return cls()
        succeeded, retried, dead_lettered = (as_int(x) for x in reply)
        return cls(succeeded, retried, dead_lettered)


@dataclass
class _Acc:
    """What one sample counts for one queue (or all queues)."""

    enqueued: int = 0
    waits: list[int] = field(default_factory=list)
    runs: list[int] = field(default_factory=list)


async def last_sample_ms(redis: Client) -> int:
    """Time of the newest overall sample (epoch ms; 0 = none). One LINDEX."""
    raw = await redis.lindex(keys.HISTORY, 0)
    try:
        return int(json.loads(raw)["t"]) if raw else 0
    except (ValueError, KeyError, TypeError):
        return 0


async def take_sample(redis: Client, queues: list[str], since_ms: int, now_ms: int,
                      points: int, ttl_ms: int) -> dict[str, dict[str, Any]]:
    """Take and store one sample of ``queues`` (and of all queues together).

    Args:
        queues: the queues to sample (busy ones; also any queue a task read names).
        since_ms: start of the window (the previous sample's time), epoch ms.
        now_ms: end of the window and the sample's time (Redis TIME), epoch ms.
        points: most samples kept per list (LTRIM).
        ttl_ms: PEXPIRE of each list written.

    Returns:
        The samples written, by queue name ("" = all queues).

    Cost: one ZCOUNT and one ZRANGEBYSCORE of the recent index, one HMGET per task
    read (at most SAMPLE_MAX, pipelined), one history_counters.lua call and the band
    reads of GetQueueStats per queue, and LPUSH + LTRIM + PEXPIRE per list.
    """
    total = await redis.zcount(keys.RECENT_TASKS, f"({since_ms}", now_ms)
    ids = [text(t) for t in await redis.zrevrangebyscore(
        keys.RECENT_TASKS, now_ms, f"({since_ms}", start=0, num=SAMPLE_MAX)]
    accs: dict[str, _Acc] = {"": _Acc(enqueued=int(total))}
    for i in range(0, len(ids), _CHUNK):
        async with redis.pipeline(transaction=False) as pipe:
            for task_id in ids[i:i + _CHUNK]:
                pipe.hmget(keys.task(task_id), "queue", "created_at_ms", "not_before_ms",
                           "started_at_ms", "finished_at_ms")
            rows = await pipe.execute(raise_on_error=False)
        for row in rows:
            if isinstance(row, Exception) or not row or not row[0]:
                continue
            q = text(row[0])
            created, not_before, started, finished = (as_int(x) for x in row[1:])
            acc = accs.setdefault(q, _Acc())
            acc.enqueued += 1
            for a in (acc, accs[""]):
                if started:
                    a.waits.append(max(0, started - max(created, not_before)))
                if started and finished:
                    a.runs.append(max(0, finished - started))
    scale = total / len(ids) if ids and total > len(ids) else 1.0
    names = sorted(set(queues) | {q for q in accs if q and keys.QUEUE_RE.match(q)})
    names = names[:MAX_QUEUES]
    counters: list[Any] = []
    if names:
        calls = ScriptPipeline(redis)
        for q in names:
            HISTORY_COUNTERS.queue(calls, [keys.queue_counters(q)], Script.argv())
        counters = await execute(redis, calls)
    bands = await band_infos_many(redis, names) if names else {}
    samples: dict[str, dict[str, Any]] = {}
    overall: dict[str, Any] = {
        "t": now_ms, "dt": now_ms - since_ms, "enqueued": int(total), "succeeded": 0,
        "failed": 0, "dead_lettered": 0, "depth": 0, "backlog_age_ms": 0,
        "wait_ms": percentiles(accs[""].waits), "run_ms": percentiles(accs[""].runs)}
    for q, row in zip(names, counters):
        d = OutcomeDeltas.of(row)
        qb = bands.get(q, [])
        oldest = [b.oldest_undelivered_ms for b in qb if b.oldest_undelivered_ms]
        acc = accs.get(q, _Acc())
        s = {"t": now_ms, "dt": now_ms - since_ms, "enqueued": round(acc.enqueued * scale),
             "succeeded": d.succeeded, "failed": d.retried + d.dead_lettered,
             "dead_lettered": d.dead_lettered,
             "depth": sum(b.depth for b in qb),
             "backlog_age_ms": max(0, now_ms - min(oldest)) if oldest else 0,
             "wait_ms": percentiles(acc.waits), "run_ms": percentiles(acc.runs)}
        samples[q] = s
        for k in ("succeeded", "failed", "dead_lettered", "depth"):
            overall[k] += s[k]
        overall["backlog_age_ms"] = max(overall["backlog_age_ms"], s["backlog_age_ms"])
    samples[""] = overall
    async with redis.pipeline(transaction=False) as pipe:
        for q, s in samples.items():
            key = keys.history(q) if q else keys.HISTORY
            pipe.lpush(key, json.dumps(s, separators=(",", ":")))
            pipe.ltrim(key, 0, points - 1)
            pipe.pexpire(key, ttl_ms)
        await pipe.execute()
    return samples


async def read(redis: Client, queue: str, count: int) -> list[dict[str, Any]]:
    """The newest ``count`` samples of ``queue`` ("" = all queues), oldest first, as
    stored. One LRANGE; malformed entries are skipped."""
    raw = await redis.lrange(keys.history(queue) if queue else keys.HISTORY, 0, count - 1)
    out = []
    for item in reversed(raw):
        try:
            s = json.loads(item)
        except ValueError:
            continue
        if isinstance(s, dict) and isinstance(s.get("t"), int):
            out.append(s)
    return out
