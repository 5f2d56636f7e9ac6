"""Admin listings: workers, recent tasks and the audit stream.

"Now" comes from Redis TIME (one clock for every replica). Functions return plain
data; ``admin_servicer`` converts it to protobuf.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from dtq_gateway.store import keys
from dtq_gateway.store.admin_common import as_int, redis_now_ms, validate_page_token
from dtq_gateway.store.admin_scripts import TASK_SUMMARIES
from dtq_gateway.store.client import Client
from dtq_gateway.store.replies import text
from dtq_gateway.store.scripts import call_each
from dtq_gateway.store.task_record import normalize

_CHUNK = 500


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """One worker liveness record (ListWorkers)."""

    worker_id: str
    hostname: str
    started_at_ms: int
    last_heartbeat_at_ms: int
    heartbeat_age_ms: int
    active_tasks: int
    concurrency: int
    tasks_processed: int
    tasks_failed: int
    tasks_retried: int
    status: str
    alive: bool
    #: an open Lease stream on a live gateway (the leasing@<gateway tag> counts of the
    #: record, for gateways whose dtq:gateway:<tag> key exists)
    leasing: bool = False
    #: labels, queues and task type filter of the worker's latest Lease session
    labels: dict[str, str] = field(default_factory=dict)
    queues: tuple[str, ...] = ()
    task_types: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AuditItem:
    """One audit stream entry."""

    entry_id: str
    actor: str
    action: str
    task_id: str
    ts_ms: int
    request_id: str
    detail: str


def _ms_field(f: dict[str, bytes], *names: str) -> int:
    """First present field among ``names`` as epoch ms (seconds values are scaled)."""
    for name in names:
        if name in f and text(f[name]):
            value = float(text(f[name]) or 0)
            return int(value * 1000) if 0 < value < 1e11 else int(value)
    return 0


def _labels(raw: bytes | None) -> dict[str, str]:
    try:
        value = json.loads(text(raw) or "{}")
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _names(raw: bytes | None) -> tuple[str, ...]:
    return tuple(n for n in text(raw).split(",") if n)


async def list_workers(redis: Client, heartbeat_interval_ms: int) -> list[WorkerRecord]:
    """Known workers (``dtq:workers`` members whose hash still exists), by id.

    ``alive`` = last heartbeat younger than 3 heartbeat intervals. ``status`` is
    "stopped" when the record says so, else "alive" or "stale" by that rule.
    """
    ids = sorted(text(m) for m in await redis.smembers(keys.WORKERS))
    async with redis.pipeline(transaction=False) as pipe:
        for worker_id in ids:
            pipe.hgetall(keys.worker(worker_id))
        hashes = await pipe.execute()
    now = await redis_now_ms(redis)
    tags = sorted({text(k)[len("leasing@"):] for raw in hashes for k, v in (raw or {}).items()
                   if text(k).startswith("leasing@") and as_int(v) > 0})
    live_tags: set[str] = set()
    if tags:
        async with redis.pipeline(transaction=False) as pipe:
            for tag in tags:
                pipe.exists(keys.gateway(tag))
            live_tags = {t for t, n in zip(tags, await pipe.execute()) if n}
    return worker_records(ids, hashes, now, heartbeat_interval_ms, live_tags)


def worker_records(ids: list[str], hashes: list[Any], now_ms: int, heartbeat_interval_ms: int,
                   live_tags: set[str] | frozenset[str] = frozenset()) -> list[WorkerRecord]:
    """The WorkerRecords of worker ``ids`` from their hashes (HGETALL replies, in the
    order of ``ids``; an empty one, an expired record, is left out).

    Args:
        now_ms: Redis TIME in epoch ms, against which heartbeat ages are taken.
        heartbeat_interval_ms: alive = last heartbeat younger than 3 of them.
        live_tags: tags of live gateway replicas (``leasing`` is True for a worker
            with a Lease stream open on one of them).
    """
    out = []
    for worker_id, raw in zip(ids, hashes):
        if not raw:
            continue  # record expired (3 heartbeat intervals); the set is best effort
        f = normalize(raw)
        last = _ms_field(f, "last_heartbeat", "last_heartbeat_at_ms")
        age = max(0, now_ms - last) if last else now_ms
        alive = age < 3 * heartbeat_interval_ms
        stored = text(f.get("status"))
        status = stored if stored in ("stopped", "draining") else ("alive" if alive else "stale")
        out.append(WorkerRecord(
            worker_id=worker_id, hostname=text(f.get("hostname")),
            started_at_ms=_ms_field(f, "started_at", "started_at_ms"),
            last_heartbeat_at_ms=last, heartbeat_age_ms=age,
            active_tasks=as_int(f.get("active_tasks")), concurrency=as_int(f.get("concurrency")),
            tasks_processed=as_int(f.get("tasks_processed")),
            tasks_failed=as_int(f.get("tasks_failed")),
            tasks_retried=as_int(f.get("tasks_retried")),
            status=status, alive=alive and status != "stopped",
            leasing=any(k.startswith("leasing@") and k[len("leasing@"):] in live_tags
                        and as_int(v) > 0 for k, v in f.items()),
            labels=_labels(f.get("labels")), queues=_names(f.get("queues")),
            task_types=_names(f.get("task_types"))))
    return out


async def worker_session_fields(redis: Client, worker_ids: list[str]
                                ) -> list[tuple[bytes | None, bytes | None]]:
    """The raw ``queues`` and ``labels`` fields of each worker record (None where absent),
    in the order of ``worker_ids``: one HMGET per worker, one pipeline."""
    async with redis.pipeline(transaction=False) as pipe:
        for worker_id in worker_ids:
            pipe.hmget(keys.worker(worker_id), "queues", "labels")
        rows = await pipe.execute()
    return [(queues, labels) for queues, labels in rows]

async def task_summaries(redis: Client, task_ids: list[str]) -> list[dict[str, bytes]]:
    """Task hashes without payloads, in order ({} for expired records)."""
    if not task_ids:
        return []
    # one call per hash slot (a task's key is in its queue's slot), one pipeline
    by_slot: dict[int, list[int]] = {}
    for i, t in enumerate(task_ids):
        by_slot.setdefault(keys.key_slot(keys.task(t)), []).append(i)
    groups = list(by_slot.values())
    replies = await call_each(redis, TASK_SUMMARIES, [
        ([keys.task(task_ids[i]) for i in g], TASK_SUMMARIES.argv()) for g in groups])
    rows: list = [None] * len(task_ids)
    for g, reply in zip(groups, replies):
        if isinstance(reply, Exception):
            raise reply
        for i, row in zip(g, reply):
            rows[i] = row
    return [normalize(dict(zip(row[0::2], row[1::2]))) for row in rows]


async def list_recent_tasks(redis: Client, limit: int, queue: str = "",
                            status: str = "") -> list[dict[str, bytes]]:
    """Newest tasks of ``dtq:tasks:recent`` (payload omitted), filtered.

    Args:
        limit: most tasks returned.
        queue: only this queue ("" = any).
        status: only this hash status string ("" = any).
    """
    out: list[dict[str, bytes]] = []
    start = 0
    while len(out) < limit:
        ids = [text(t) for t in await redis.zrevrange(keys.RECENT_TASKS, start,
                                                      start + _CHUNK - 1)]
        if not ids:
            break
        start += len(ids)
        for f in await task_summaries(redis, ids):
            if not f or (queue and text(f.get("queue")) != queue) or (
                    status and text(f.get("status")) != status):
                continue
            out.append(f)
            if len(out) == limit:
                break
    return out


async def list_audit(redis: Client, size: int, token: str = "") -> tuple[list[AuditItem], str]:
    """One page of the audit stream, newest first.

    Returns:
        The entries and the next page token ("" at the end).
    """
    validate_page_token(token)
    rows = await redis.xrevrange(keys.AUDIT, max=f"({token}" if token else "+", min="-",
                                 count=size + 1)
    rows = rows or []
    items = []
    for entry_id, raw in rows[:size]:
        f = normalize(raw or {})
        items.append(AuditItem(
            entry_id=text(entry_id), actor=text(f.get("actor")), action=text(f.get("action")),
            task_id=text(f.get("task_id")), ts_ms=as_int(f.get("ts")),
            request_id=text(f.get("request_id")), detail=text(f.get("detail"))))
    return items, (items[-1].entry_id if len(rows) > size else "")
