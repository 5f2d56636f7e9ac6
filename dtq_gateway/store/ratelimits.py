"""Rate limits: N leases per period per queue, or per (queue, task type).

A limit is a token bucket shared by every gateway, kept in the queue's own hash
``dtq:queue:<queue>:ratelimit`` (layout in ``lua/_bucket.lua``), so every limiter
script touches the keys of one queue only. Where the check happens (why a throttled
task is never lost nor counted as an attempt, docs/rate-limits.md):

* the queue-wide limit is taken inside ``lease_take.lua``: the COUNT of each
  XREADGROUP is capped at the bucket's whole tokens, so a throttled task is simply not
  read; it stays queued in its stream, in order.
* a task-type limit is taken by :func:`take_types` after the read and before
  ``activate.lua``: entries beyond the grant are activated in mode ``r`` (put back at
  the tail of their stream, still queued, same attempt), so other types behind them
  keep flowing.

Tokens taken for entries that were then not delivered (absorbed, cancelled, put back)
are given back by :func:`give_back`. The Admin side (:func:`set_limit`,
:func:`delete_limit`, :func:`list_page`) validates and stores the limits; the
registry ``dtq:ratelimits`` (queue names) and the index ``dtq:ratelimits:index`` (one
member ``<queue> <scope>`` per limit, every score 0) are touched with single-key
commands only. The index is written before the limit and removed after it, so a
crash leaves at most an index member without a limit, which listings skip.
ListRateLimits pages through the index with ZRANGEBYLEX and reads only the page's
limits (one HMGET each); DTQ_MAX_RATE_LIMITS bounds its ZCARD (checked before the
write, so replicas adding limits at the same instant may pass it by a few).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dtq_gateway import metrics
from dtq_gateway.errors import InvalidArgument, RateLimitLimit
from dtq_gateway.store import keys
from dtq_gateway.store.admin_common import redis_now_ms
from dtq_gateway.store.client import Client
from dtq_gateway.store.replies import text
from dtq_gateway.store.scripts import Script, ScriptPipeline, execute

RATE_TAKE = Script("rate_take", helpers=("_bucket",))
RATE_LIMIT_SET = Script("rate_limit_set", helpers=("_bucket",))
#: Scope of a queue-wide limit in the bucket hash (a task type never contains '*').
QUEUE_SCOPE = "*"
MAX_LIMIT = 1_000_000
MAX_PERIOD_MS = 86_400_000
DEFAULT_PERIOD_MS = 1000
#: Index members added per ZADD when the index is built for older data.
_INDEX_CHUNK = 1000


@dataclass(frozen=True, slots=True)
class RateLimit:
    """One limit: ``limit`` leases per ``period_ms`` ms, at most ``burst`` at once."""

    queue: str
    task_type: str  # "" = the whole queue
    limit: int
    period_ms: int
    burst: int
    tokens: float = 0.0


@dataclass(frozen=True, slots=True)
class RateLimitSetReply:
    """rate_limit_set.lua's reply: ``outcome`` created, changed, deleted or missing;
    ``gone`` when the queue's limits hash is gone (no limit left)."""

    outcome: str
    gone: bool

    @classmethod
    def of(cls, reply: list[Any]) -> RateLimitSetReply:
        """Decode ``{outcome, 1 = hash gone else 0}``."""
        return cls(text(reply[0]), bool(int(reply[1])))


@dataclass(frozen=True, slots=True)
class TokenGrant:
    """rate_take.lua's answer for one (scope, n) pair: ``granted`` tokens (n for a scope
    without a limit, 0 for a give-back), ``wait_ms`` until the next token when fewer
    than n were granted, else 0."""

    granted: int
    wait_ms: int

    @classmethod
    def decode_all(cls, reply: list[Any]) -> list[TokenGrant]:
        """Decode ``{{granted, wait_ms}, ...}``, one per pair in call order."""
        return [cls(int(granted), int(wait_ms)) for granted, wait_ms in reply]


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


def _member(queue: str, scope: str) -> str:
    """The index member of one limit (keys.RATE_LIMIT_INDEX)."""
    return f"{queue} {scope}"


async def set_limit(redis: Client, rl: RateLimit, actor: str, max_limits: int = 0) -> bool:
    """Store a validated limit; True when it is new (False: an existing one changed).

    The registry and index entries are written first: a crash after them leaves
    members without a limit, which listings skip.

    Args:
        max_limits: DTQ_MAX_RATE_LIMITS (0 = no bound); changing a limit always passes.

    Raises:
        RateLimitLimit: the limit would be new and ``max_limits`` limits exist.
    """
    member = _member(rl.queue, rl.task_type or QUEUE_SCOPE)
    if max_limits:
        await _ensure_index(redis)
        async with redis.pipeline(transaction=False) as check:
            check.zscore(keys.RATE_LIMIT_INDEX, member)
            check.zcard(keys.RATE_LIMIT_INDEX)
            score, count = await check.execute()
        if score is None and count >= max_limits:
            metrics.LIMIT_REFUSALS.labels(limit="max_rate_limits").inc()
            raise RateLimitLimit(
                f"rate_limit: a new limit of queue {rl.queue!r} and {count} limits exist "
                f"(DTQ_MAX_RATE_LIMITS={max_limits}); change or delete one",
                field="rate_limit")
    await redis.sadd(keys.RATE_LIMITED_QUEUES, rl.queue)
    await redis.zadd(keys.RATE_LIMIT_INDEX, {member: 0})
    reply = RateLimitSetReply.of(await RATE_LIMIT_SET(
        redis, [keys.rate_limit(rl.queue)], RATE_LIMIT_SET.argv(
            rl.task_type or QUEUE_SCOPE, f"{rl.limit} {rl.period_ms} {rl.burst}", rl.queue,
            actor)))
    return reply.outcome == "created"


async def delete_limit(redis: Client, queue: str, task_type: str, actor: str) -> bool:
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
    reply = RateLimitSetReply.of(await RATE_LIMIT_SET(
        redis, [keys.rate_limit(queue)], RATE_LIMIT_SET.argv(task_type or QUEUE_SCOPE, "",
                                                             queue, actor)))
    await redis.zrem(keys.RATE_LIMIT_INDEX, _member(queue, task_type or QUEUE_SCOPE))
    if reply.gone:
        await redis.srem(keys.RATE_LIMITED_QUEUES, queue)
    return reply.outcome == "deleted"


async def forget_queue(redis: Client, queue: str) -> None:
    """Drop the index members of a deleted queue's limits (DeleteQueue, after the
    queue's limits hash is gone), then re-add those of limits a SetRateLimit wrote
    meanwhile (read back from the hash)."""
    await redis.zremrangebylex(keys.RATE_LIMIT_INDEX, f"[{queue} ", f"({queue}!")
    fields = [text(f) for f in await redis.hkeys(keys.rate_limit(queue))]
    members = {_member(queue, f[4:]): 0 for f in fields if f.startswith("cfg|")}
    if members:
        await redis.zadd(keys.RATE_LIMIT_INDEX, members)


def _parse(queue: str, fields: dict[bytes, bytes], now_ms: int) -> list[RateLimit]:
    """The limits stored in one bucket hash, queue-wide first, then by task type."""
    out = []
    for raw_field, raw_cfg in fields.items():
        name = text(raw_field)
        if not name.startswith("cfg|") or not raw_cfg:
            continue
        scope = name[4:]
        limit, period, burst = (int(x) for x in text(raw_cfg).split())
        tok = float(fields.get(f"tok|{scope}".encode()) or burst)
        ts = int(fields.get(f"ts|{scope}".encode()) or now_ms)
        tok = min(burst, tok + max(0, now_ms - ts) * limit / period)
        out.append(RateLimit(queue, "" if scope == QUEUE_SCOPE else scope, limit, period,
                             burst, round(tok, 3)))
    return sorted(out, key=lambda r: (r.task_type != "", r.task_type))


def _check_token(token: str, queue: str) -> str:
    """A ListRateLimits page token: ``<queue> <scope>`` of the previous page's last limit
    (of ``queue`` when one is named)."""
    q, sep, scope = token.partition(" ")
    if not sep or not keys.QUEUE_RE.match(q) or (queue and q != queue) or not (
            scope == QUEUE_SCOPE or keys.TASK_TYPE_RE.match(scope)):
        raise InvalidArgument("page_token: malformed page token (use next_page_token)",
                              field="page_token")
    return token


async def list_page(redis: Client, size: int, token: str = "", queue: str = ""
                    ) -> tuple[list[RateLimit], str]:
    """One page of limits sorted by queue, the queue-wide limit first, then by task
    type: one ZRANGEBYLEX of the index and one HMGET per limit of the page.

    Args:
        size: most limits returned.
        token: the previous page's next_page_token ("" = first page).
        queue: only this queue's limits ("" = every queue's).

    Returns:
        The limits and the next page token ("" after the last page).

    Raises:
        InvalidArgument: malformed ``queue`` or ``page_token``.
    """
    if queue and not keys.QUEUE_RE.match(queue):
        raise InvalidArgument("queue: queue name must match [A-Za-z0-9_.-]{1,64}",
                              field="queue")
    if token:
        _check_token(token, queue)
    await _ensure_index(redis)
    low = f"({token}" if token else (f"[{queue} " if queue else "-")
    high = f"({queue}!" if queue else "+"
    members = [text(m) for m in await redis.zrangebylex(keys.RATE_LIMIT_INDEX, low, high,
                                                        start=0, num=size + 1)]
    page = [m.partition(" ")[::2] for m in members[:size]]
    now_ms = await redis_now_ms(redis)
    pipe = redis.pipeline(transaction=False)
    for q, scope in page:
        pipe.hmget(keys.rate_limit(q), f"cfg|{scope}", f"tok|{scope}", f"ts|{scope}")
    out: list[RateLimit] = []
    for (q, scope), (cfg, tok, ts) in zip(page, await pipe.execute()):
        out += _parse(q, {f"cfg|{scope}".encode(): cfg, f"tok|{scope}".encode(): tok,
                          f"ts|{scope}".encode(): ts}, now_ms)
    return out, (members[size - 1] if len(members) > size else "")


async def _ensure_index(redis: Client) -> None:
    """Build the index once from the limits stored before it existed (the registry's
    queues' hashes); afterwards one GET."""
    if await redis.get(keys.RATE_LIMIT_INDEX_BUILT):
        return
    queues = sorted(text(q) for q in await redis.smembers(keys.RATE_LIMITED_QUEUES))
    for i in range(0, len(queues), _INDEX_CHUNK):
        chunk = queues[i:i + _INDEX_CHUNK]
        pipe = redis.pipeline(transaction=False)
        for q in chunk:
            pipe.hkeys(keys.rate_limit(q))
        members = {_member(q, text(f)[4:]): 0 for q, fields in zip(chunk, await pipe.execute())
                   for f in fields if text(f).startswith("cfg|")}
        if members:
            await redis.zadd(keys.RATE_LIMIT_INDEX, members)
    await redis.set(keys.RATE_LIMIT_INDEX_BUILT, "1")


# -- the dispatcher's side ------------------------------------------------------------

@dataclass(slots=True)
class Limits:
    """The rate-limit part of a lease_take reply, with queue names resolved."""

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


async def take_types(redis: Client, wanted: list[tuple[str, str]]
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
    pipe = ScriptPipeline(redis)
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
        for task_type, grant in zip(counts, TokenGrant.decode_all(reply)):
            grants[(queue, task_type)] = grant.granted
            if grant.wait_ms:
                waits[queue] = min(waits.get(queue, grant.wait_ms), grant.wait_ms)
    out = []
    for item in wanted:
        out.append(grants[item] > 0)
        grants[item] -= 1
    return out, waits


async def give_back(redis: Client, returns: dict[str, Counter[str]]) -> None:
    """Return tokens taken for entries that were not delivered.

    Args:
        returns: per queue, tokens per scope (``"*"`` or a task type) to give back.
    """
    pipe = ScriptPipeline(redis)
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
