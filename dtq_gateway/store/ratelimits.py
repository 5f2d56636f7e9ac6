"""Rate limits: N leases per period per queue, or per (queue, task type).

A limit is a token bucket shared by every gateway, kept in the queue's own hash
``dtq:queue:<queue>:ratelimit`` (layout in ``lua/_bucket.lua``), so every limiter
script touches the keys of one queue only. Where the check happens (why a throttled
task is never lost nor counted as an attempt, docs/rate-limits.md):

* the queue-wide limit is taken inside ``lease_read.lua``: the COUNT of each
  XREADGROUP is capped at the bucket's whole tokens, so a throttled task is simply not
  read; it stays queued in its stream, in order.
* a task-type limit is taken by :func:`take_types` after the read and before
  ``activate.lua``: entries beyond the grant are activated in mode ``r`` (put back at
  the tail of their stream, still queued, same attempt), so other types behind them
  keep flowing.

Tokens taken for entries that were then not delivered (absorbed, cancelled, put back)
are given back by :func:`give_back`. The Admin side (:func:`set_limit`,
:func:`delete_limit`, :func:`list_limits`) validates and stores the limits; the
registry ``dtq:ratelimits`` (queue names) is touched with single-key commands only.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from dtq_gateway import metrics
from dtq_gateway.errors import InvalidArgument
from dtq_gateway.store import keys
from dtq_gateway.store.admin import redis_now_ms
from dtq_gateway.store.replies import text
from dtq_gateway.store.scripts import Script, execute

RATE_TAKE = Script("rate_take", helpers=("_bucket",))
RATE_LIMIT_SET = Script("rate_limit_set", helpers=("_bucket",))
#: Scope of a queue-wide limit in the bucket hash (a task type never contains '*').
QUEUE_SCOPE = "*"
MAX_LIMIT = 1_000_000
MAX_PERIOD_MS = 86_400_000
DEFAULT_PERIOD_MS = 1000


@dataclass(frozen=True, slots=True)
class RateLimit:
    """One limit: ``limit`` leases per ``period_ms`` ms, at most ``burst`` at once."""

    queue: str
    task_type: str  # "" = the whole queue
    limit: int
    period_ms: int
    burst: int
    tokens: float = 0.0


def validate(queue: str, task_type: str, limit: int, period_ms: int, burst: int) -> RateLimit:
    """Apply defaults and ranges (see proto RateLimit).

    Raises:
        InvalidArgument: naming ``rate_limit.<field>``.
    """
    if not keys.QUEUE_RE.match(queue):
        raise InvalidArgument("rate_limit.queue: queue name must match [A-Za-z0-9_.-]{1,64}",
                              field="rate_limit.queue")
    if task_type and not keys.TASK_TYPE_RE.match(task_type):
        raise InvalidArgument("rate_limit.task_type: must match [A-Za-z0-9_.:/-]{1,128}",
                              field="rate_limit.task_type")
    period_ms = period_ms or DEFAULT_PERIOD_MS
    burst = burst or limit
    for name, value, hi in (("limit", limit, MAX_LIMIT), ("period_ms", period_ms, MAX_PERIOD_MS),
                            ("burst", burst, MAX_LIMIT)):
        if not 1 <= value <= hi:
            raise InvalidArgument(f"rate_limit.{name}: must be 1..{hi}",
                                  field=f"rate_limit.{name}")
    return RateLimit(queue, task_type, limit, period_ms, burst)


async def set_limit(redis: Redis, rl: RateLimit, actor: str) -> bool:
    """Store a validated limit; True when it is new (False: an existing one changed).

    The registry entry is written first: a crash after it leaves a registry member
    without limits, which listings skip.
    """
    await redis.sadd(keys.RATE_LIMITED_QUEUES, rl.queue)
    outcome, _ = await RATE_LIMIT_SET(redis, [keys.rate_limit(rl.queue)], RATE_LIMIT_SET.argv(
        rl.task_type or QUEUE_SCOPE, f"{rl.limit} {rl.period_ms} {rl.burst}", rl.queue, actor))
    return text(outcome) == "created"


async def delete_limit(redis: Redis, queue: str, task_type: str, actor: str) -> bool:
    """Remove one limit; True when there was one.

    Raises:
        InvalidArgument: malformed queue or task_type.
    """
    if not keys.QUEUE_RE.match(queue):
        raise InvalidArgument("queue: queue name must match [A-Za-z0-9_.-]{1,64}",
                              field="queue")
    if task_type and not keys.TASK_TYPE_RE.match(task_type):
        raise InvalidArgument("task_type: must match [A-Za-z0-9_.:/-]{1,128}",
                              field="task_type")
    outcome, gone = await RATE_LIMIT_SET(redis, [keys.rate_limit(queue)], RATE_LIMIT_SET.argv(
        task_type or QUEUE_SCOPE, "", queue, actor))
    if int(gone):
        await redis.srem(keys.RATE_LIMITED_QUEUES, queue)
    return text(outcome) == "deleted"


def _parse(queue: str, fields: dict[bytes, bytes], now_ms: int) -> list[RateLimit]:
    """The limits stored in one bucket hash, queue-wide first, then by task type."""
    out = []
    for raw_field, raw_cfg in fields.items():
        name = text(raw_field)
        if not name.startswith("cfg|"):
            continue
        scope = name[4:]
        limit, period, burst = (int(x) for x in text(raw_cfg).split())
        tok = float(fields.get(f"tok|{scope}".encode(), burst))
        ts = int(fields.get(f"ts|{scope}".encode(), now_ms))
        tok = min(burst, tok + max(0, now_ms - ts) * limit / period)
        out.append(RateLimit(queue, "" if scope == QUEUE_SCOPE else scope, limit, period,
                             burst, round(tok, 3)))
    return sorted(out, key=lambda r: (r.task_type != "", r.task_type))


async def list_limits(redis: Redis, queue: str = "") -> list[RateLimit]:
    """The limits of ``queue`` ("" = every queue in the registry), sorted.

    Raises:
        InvalidArgument: malformed queue.
    """
    if queue and not keys.QUEUE_RE.match(queue):
        raise InvalidArgument("queue: queue name must match [A-Za-z0-9_.-]{1,64}",
                              field="queue")
    queues = [queue] if queue else sorted(
        text(q) for q in await redis.smembers(keys.RATE_LIMITED_QUEUES))
    now_ms = await redis_now_ms(redis)
    pipe = redis.pipeline(transaction=False)
    for q in queues:
        pipe.hgetall(keys.rate_limit(q))
    out: list[RateLimit] = []
    for q, fields in zip(queues, await pipe.execute()):
        out += _parse(q, fields, now_ms)
    return out


# -- the dispatcher's side ------------------------------------------------------------

@dataclass(slots=True)
class Limits:
    """The rate-limit part of a lease_read reply, with queue names resolved."""

    wait_ms: int
    typed: set[str]
    limited: set[str]
    throttled: set[str]

    @classmethod
    def from_reply(cls, part: list, queues: list[str]) -> Limits:
        """Parse ``{wait_ms, {typed}, {limited}, {throttled}}`` (1-based queue indexes)."""
        names = [{queues[int(i) - 1] for i in part[k]} for k in (1, 2, 3)]
        return cls(int(part[0]), *names)


class Waker:
    """Reads a throttled queue again when its bucket holds a token (one timer per queue).

    Args:
        notify: ``notify(queue)`` of the dispatcher (a task may be leasable).
    """

    def __init__(self, notify: Callable[[str], None]) -> None:
        self._notify = notify
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def throttled(self, queues: set[str], wait_ms: int, counter: Any, count: int = 1) -> None:
        """Count throttling of ``queues`` on ``counter`` and wake each in ``wait_ms`` ms
        (an earlier timer of the queue stands; a later one is moved earlier, e.g. after
        a limit was raised)."""
        loop = asyncio.get_running_loop()
        for queue in queues:
            metrics.queue_child(counter, queue).inc(count)
            at = loop.time() + max(wait_ms, 1) / 1000
            timer = self._timers.get(queue)
            if timer is not None and timer.when() <= at:
                continue
            if timer is not None:
                timer.cancel()
            self._timers[queue] = loop.call_at(at, self._wake, queue)

    def _wake(self, queue: str) -> None:
        self._timers.pop(queue, None)
        self._notify(queue)

    def cancel(self) -> None:
        """Drop every pending wake-up (the dispatcher stops)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()


async def take_types(redis: Redis, wanted: list[tuple[str, str]]
                     ) -> tuple[list[bool], dict[str, int]]:
    """Take one token per entry of a queue with task-type limits.

    Args:
        wanted: (queue, task_type) per entry to activate, in lease order.

    Returns:
        (granted per entry, ms until the next token per throttled queue). Within one
        (queue, type) the first entries in lease order get the tokens.
    """
    per_queue: dict[str, Counter[str]] = {}
    for queue, task_type in wanted:
        per_queue.setdefault(queue, Counter())[task_type] += 1
    pipe = redis.pipeline(transaction=False)
    calls = list(per_queue.items())
    for queue, counts in calls:
        args: list = []
        for task_type, n in counts.items():
            args += [task_type, n]
        RATE_TAKE.queue(pipe, [keys.rate_limit(queue)], RATE_TAKE.argv(*args))
    grants: dict[tuple[str, str], int] = {}
    waits: dict[str, int] = {}
    for (queue, counts), reply in zip(calls, await execute(redis, pipe)):
        if isinstance(reply, Exception):
            raise reply
        for task_type, (granted, wait_ms) in zip(counts, reply):
            grants[(queue, task_type)] = int(granted)
            if int(wait_ms):
                waits[queue] = min(waits.get(queue, int(wait_ms)), int(wait_ms))
    out = []
    for item in wanted:
        out.append(grants[item] > 0)
        grants[item] -= 1
    return out, waits


async def give_back(redis: Redis, returns: dict[str, Counter[str]]) -> None:
    """Return tokens taken for entries that were not delivered.

    Args:
        returns: per queue, tokens per scope (``"*"`` or a task type) to give back.
    """
    pipe = redis.pipeline(transaction=False)
    for queue, counts in returns.items():
        args: list = []
        for scope, n in counts.items():
            args += [scope, -n]
        if args:
            RATE_TAKE.queue(pipe, [keys.rate_limit(queue)], RATE_TAKE.argv(*args))
    if len(pipe):
        for reply in await execute(redis, pipe):
            if isinstance(reply, Exception):
                raise reply
