"""Seed Redis state for admin tests by writing hashes and streams directly.

The shapes follow docs/design.md (task record, stream entry) and the seed's
dead-letter fields, so admin code is tested without the Broker's scripts.
"""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio as aioredis

from dtq_gateway.store import keys


def new_id(queue: str = "q1") -> str:
    """A fresh task id of ``queue`` (32 hex and the queue's slot tag)."""
    return keys.new_task_id(queue)


async def now_ms(r: aioredis.Redis) -> int:
    """Redis TIME in epoch ms."""
    sec, usec = await r.time()
    return int(sec) * 1000 + int(usec) // 1000


async def ensure_group(r: aioredis.Redis, queue: str, band: int) -> None:
    """Create the consumer group (MKSTREAM), ignoring BUSYGROUP, and register the
    queue in ``dtq:queues`` (as the gateway's Groups.ensure does)."""
    await r.zadd(keys.QUEUES, {queue: 0})
    try:
        await r.xgroup_create(keys.stream(queue, band), keys.GROUP, id="0", mkstream=True)
    except aioredis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


async def put_task(r: aioredis.Redis, queue: str = "q1", *, band: int = 5,
                   status: str = "queued", task_type: str = "t.echo", attempt: int = 1,
                   max_attempts: int = 3, payload: bytes = b'{"x":1}', idem_key: str = "",
                   metadata: dict[str, str] | None = None, created_at_ms: int | None = None,
                   stream_entry: bool = True, **extra: Any) -> str:
    """Write a task hash (and, when ``stream_entry``, its band entry); returns its id."""
    task_id = new_id(queue)
    created = created_at_ms if created_at_ms is not None else await now_ms(r)
    fields: dict[str, Any] = {
        "task_id": task_id, "queue": queue, "task_type": task_type, "payload": payload,
        "content_type": "application/json", "priority": band, "max_attempts": max_attempts,
        "timeout_ms": 60000, "idem_key": idem_key,
        "idem_digest": keys.idempotency_digest(idem_key) if idem_key else "",
        "metadata": json.dumps(metadata or {}), "backoff_base_ms": 1000,
        "backoff_cap_ms": 300000, "status": status, "attempt": attempt, "entry_id": "",
        "created_at_ms": created, "updated_at_ms": created, "not_before_ms": 0,
        "expires_at_ms": 0, "due_at_ms": 0, **extra}
    await r.hset(keys.task(task_id), mapping=fields)
    await r.expire(keys.task(task_id), 7 * 86400)
    await r.zadd(keys.RECENT_TASKS, {task_id: created})
    if stream_entry:
        await ensure_group(r, queue, band)
        entry_id = await r.xadd(keys.stream(queue, band), {
            "task_id": task_id, "queue": queue, "task_type": task_type, "payload": payload,
            "attempt": attempt, "max_attempts": max_attempts, "priority": band,
            "timeout_ms": 60000, "idempotency_key": idem_key})
        await r.hset(keys.task(task_id), "entry_id", entry_id)
        await r.set(keys.busy_marker(queue), "1")  # as enqueue.lua and the gateway do
        await r.sadd(keys.BUSY_QUEUES, queue)
    if idem_key:
        await r.set(keys.idempotency(queue, keys.idempotency_digest(idem_key)),
                    json.dumps({"task_id": task_id, "state": "failed", "updated_at": created}),
                    ex=86400)
    return task_id


async def dead_letter(r: aioredis.Redis, queue: str = "q1", *, band: int = 5,
                      task_type: str = "t.fail", error_class: str = "ValueError",
                      attempts: int = 3, failed_at_ms: int | None = None,
                      idem_key: str = "") -> str:
    """A task that ran ``attempts`` times and was dead-lettered; returns its id."""
    failed = failed_at_ms if failed_at_ms is not None else await now_ms(r)
    task_id = await put_task(r, queue, band=band, status="dead_lettered", task_type=task_type,
                             attempt=attempts, max_attempts=attempts, stream_entry=False,
                             idem_key=idem_key, finished_at_ms=failed, worker_id="w1",
                             last_error="boom", last_error_class=error_class)
    for n in range(1, attempts + 1):
        await r.hset(keys.task(task_id), f"att:{n}", json.dumps({
            "worker_id": "w1", "started_at_ms": failed - 10, "finished_at_ms": failed,
            "outcome": "failed", "error_message": "boom", "error_class": error_class}))
    await r.sadd(keys.DEAD_LETTER_QUEUES, queue)
    entry_id = await r.xadd(keys.dead_letter(queue), {
        "task_id": task_id, "queue": queue, "task_type": task_type, "payload": b'{"x":1}',
        "attempt": attempts, "max_attempts": attempts, "priority": band, "timeout_ms": 60000,
        "idempotency_key": idem_key, "failed_at_ms": failed, "attempts_made": attempts,
        "last_error": "boom", "last_error_class": error_class, "retryable": "0",
        "worker_id": "w1", "original_queue": queue})
    await r.hset(keys.task(task_id), "dlq_entry_id", entry_id)
    return task_id


async def put_worker(r: aioredis.Redis, worker_id: str, *, last_heartbeat_ms: int,
                     status: str = "alive", ttl_s: int = 30) -> None:
    """A worker liveness hash and its dtq:workers membership."""
    await r.hset(keys.worker(worker_id), mapping={
        "worker_id": worker_id, "hostname": "h1", "started_at": last_heartbeat_ms - 1000,
        "last_heartbeat": last_heartbeat_ms, "active_tasks": 2, "concurrency": 4,
        "tasks_processed": 10, "tasks_failed": 1, "tasks_retried": 1, "status": status})
    await r.expire(keys.worker(worker_id), ttl_s)
    await r.sadd(keys.WORKERS, worker_id)
