"""Helpers for the scheduler / reaper Redis tests: seeded tasks, leases, event capture."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any, Self

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from dtq_gateway.events.events_wire import decode
from dtq_gateway.store import keys
from tests.support.leasing import wait_until  # noqa: F401 - imported from here by the scheduler tests

_BARRIER = "__barrier__"


@pytest.fixture
async def r(redis_url: str) -> AsyncIterator[Redis]:
    """Async client (bytes replies) on the test's private, flushed redis-server."""
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def redis_ms(r: Redis) -> int:
    """Redis TIME in epoch ms."""
    s, us = await r.time()
    return int(s) * 1000 + int(us) // 1000


def new_task_id(queue: str = "emails") -> str:
    """A fresh task id of ``queue`` (32 hex and the queue's slot tag)."""
    return keys.new_task_id(queue)


async def seed_task(r: Redis, task_id: str | None = None, **overrides: Any) -> str:
    """Write a task hash with the fields of docs/design.md; returns its task_id."""
    task_id = task_id or new_task_id(overrides.get("queue", "emails"))
    now = await redis_ms(r)
    fields: dict[str, Any] = {
        "task_id": task_id, "queue": "emails", "task_type": "send", "payload": '{"to":"a"}',
        "content_type": "application/json", "priority": 5, "max_attempts": 3,
        "timeout_ms": 60000, "idem_key": "", "idem_digest": "", "metadata": "{}",
        "backoff_base_ms": 1000, "backoff_cap_ms": 300000, "status": "scheduled",
        "attempt": 1, "entry_id": "", "created_at_ms": now, "updated_at_ms": now,
        "not_before_ms": 0, "expires_at_ms": 0, "due_at_ms": now, "worker_id": "",
        "started_at_ms": 0, "finished_at_ms": 0, "last_error": "", "last_error_class": "",
    }
    fields.update(overrides)
    if fields["idem_key"] and not fields["idem_digest"]:
        fields["idem_digest"] = keys.idempotency_digest(fields["idem_key"])
    await r.hset(keys.task(task_id), mapping=fields)
    await r.expire(keys.task(task_id), 3600)
    return task_id


async def seed_idem(r: Redis, queue: str, raw_key: str, task_id: str, ttl_s: int = 86400) -> str:
    """Write a processing idempotency record; returns its key."""
    key = keys.idempotency(queue, keys.idempotency_digest(raw_key))
    await r.set(key, json.dumps({"task_id": task_id, "state": "processing", "updated_at": 1}),
                ex=ttl_s)
    return key


async def seed_lease(r: Redis, task_id: str, worker_id: str = "w1") -> tuple[str, str]:
    """Put the task's dispatch entry in its band, lease it to worker_id, mark it active.

    Returns:
        (stream key, entry id).
    """
    t = {k.decode(): v.decode() for k, v in (await r.hgetall(keys.task(task_id))).items()}
    stream = keys.stream(t["queue"], int(t["priority"]))
    try:
        await r.xgroup_create(stream, keys.GROUP, id="$", mkstream=True)
    except ResponseError as exc:  # BUSYGROUP from the second task on
        if "BUSYGROUP" not in str(exc):
            raise
    entry_id = (await r.xadd(stream, {
        "task_id": task_id, "queue": t["queue"], "task_type": t["task_type"],
        "payload": t["payload"], "attempt": t["attempt"], "max_attempts": t["max_attempts"],
        "priority": t["priority"], "timeout_ms": t["timeout_ms"],
        "idempotency_key": t["idem_key"]})).decode()
    await r.set(keys.busy_marker(t["queue"]), "1")  # as every script that adds an entry does
    await r.sadd(keys.BUSY_QUEUES, t["queue"])
    got = await r.xreadgroup(keys.GROUP, worker_id, {stream: ">"}, count=1)
    assert got and got[0][1][0][0].decode() == entry_id
    await r.hset(keys.task(task_id), mapping={
        "status": "active", "entry_id": entry_id, "worker_id": worker_id,
        "started_at_ms": await redis_ms(r)})
    return stream, entry_id


async def task_fields(r: Redis, task_id: str) -> dict[str, str]:
    """The task hash decoded to str."""
    return {k.decode(): v.decode() for k, v in (await r.hgetall(keys.task(task_id))).items()}


class Events:
    """Subscriber on dtq:events that collects every event up to a barrier message."""

    def __init__(self, r: Redis) -> None:
        self._r = r
        self._ps = r.pubsub()
        self.events: list[dict[str, Any]] = []

    async def __aenter__(self) -> Self:
        await self._ps.subscribe(keys.EVENTS_CHANNEL)
        msg = await self._ps.get_message(timeout=5.0)
        assert msg and msg["type"] == "subscribe"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._ps.unsubscribe()
        await self._ps.aclose()

    async def collect(self, timeout_s: float = 5.0) -> list[dict[str, Any]]:
        """Publish a barrier and read every event published before it."""
        await self._r.publish(keys.EVENTS_CHANNEL, _BARRIER)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = await self._ps.get_message(ignore_subscribe_messages=True, timeout=0.5)
            if msg is None:
                continue
            data = msg["data"].decode()
            if data == _BARRIER:
                return self.events
            self.events.extend(decode(data) or [])
        raise AssertionError("barrier message not received")

    async def of_type(self, ev_type: str) -> list[dict[str, Any]]:
        """Every collected event of ev_type (after a barrier)."""
        return [e for e in await self.collect() if e["type"] == ev_type]
