"""Every Redis key name dtq uses, built in this one module.

The layout follows the Redis design note (docs/redis-layout.md). No other module
concatenates key strings, and Lua scripts receive every key through KEYS, so a
rename or a future Redis Cluster hash-tag scheme touches only this file.

User-supplied strings that end up inside a key are either validated against a
restricted alphabet (queue names, worker ids, task ids) or hashed (idempotency
keys), so two different inputs can never build the same key.
"""

from __future__ import annotations

import hashlib
import re

PREFIX = "dtq:"

#: Consumer group created on every band stream.
GROUP = "workers"
#: Consumer name the reaper claims expired entries to.
REAPER_CONSUMER = "dtq-reaper"
#: Priority bands, highest first (the order leasing drains them).
BANDS_DESC = tuple(range(9, -1, -1))

QUEUE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}\Z")
WORKER_ID_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,128}\Z")
TASK_ID_RE = re.compile(r"^[0-9a-f]{32}\Z")
TASK_TYPE_RE = re.compile(r"^[A-Za-z0-9_.:/-]{1,128}\Z")

DEAD_LETTER = PREFIX + "stream:dead-letter"
AUDIT = PREFIX + "stream:audit"
RETRY_SCHEDULE = PREFIX + "retry:schedule"
RETRY_CLAIMED = PREFIX + "retry:claimed"
WORKERS = PREFIX + "workers"
CANCELLED = PREFIX + "cancelled"
RECENT_TASKS = PREFIX + "tasks:recent"
SCHEDULER_LOCK = PREFIX + "lock:scheduler"
#: Set of queue names whose band streams may hold entries (queued or leased). Every
#: script that adds an entry to a band stream of a queue that may have drained adds the
#: queue; the reaper removes a queue once all ten of its streams are empty (atomically,
#: in one script), so the reaper, the gauges and the tick work on busy queues only.
BUSY_QUEUES = PREFIX + "queues:busy"
#: Sorted set (all scores 0, ordered by name) of every queue a gateway ever created
#: groups for: ListQueues pages through it with ZRANGEBYLEX instead of SCANning keys.
QUEUES = PREFIX + "queues"
#: String set once the registry (and the busy set) were rebuilt from a SCAN of the band
#: streams (the one-time backfill for data written before they existed; see groups.py).
QUEUES_BACKFILLED = PREFIX + "queues:backfilled"
#: String: the deployment's lease-id secret (hex), created once with SET NX by the first
#: gateway that starts without DTQ_LEASE_SECRET, so that every replica signs alike.
LEASE_SECRET = PREFIX + "secret:lease"
#: Registry of periodic schedules: sorted set, member = schedule name, score = its next
#: fire (epoch ms; +inf while paused). Touched only by single-key commands, each step
#: safe if the process dies after it (see schedules.py).
SCHEDULES = PREFIX + "schedules"
#: Set of queue names that have (or had) rate limits: ListRateLimits without a queue
#: reads it. Touched only by single-key commands (see ratelimits.py).
RATE_LIMITED_QUEUES = PREFIX + "ratelimits"
#: Schedule names follow the queue-name alphabet (no ':', so keys never collide).
SCHEDULE_RE = QUEUE_RE
#: Set of queue names that may hold chain or group follow-up work (the keys of
#: :func:`chain_pending` and :func:`groups_pending`): the follow-up sweep reads only
#: these queues. Global, so only ever touched by single-key SADD / SMEMBERS; a name is
#: added before the first task or group that could need it is stored.
FOLLOWUP_QUEUES = PREFIX + "followups:queues"
#: Pub/sub channel (not a key) for lifecycle events.
EVENTS_CHANNEL = PREFIX + "events"

#: SCAN pattern matching every band stream of every queue.
BAND_STREAM_PATTERN = PREFIX + "stream:*:p[0-9]"
_BAND_STREAM_RE = re.compile(r"^dtq:stream:([A-Za-z0-9_.-]{1,64}):p([0-9])\Z")


def stream(queue: str, band: int) -> str:
    """Band stream of a queue: ``dtq:stream:<queue>:p<band>``, band 0..9."""
    return f"{PREFIX}stream:{queue}:p{band}"


def queue_streams_desc(queue: str) -> list[str]:
    """The ten band streams of a queue, p9 first."""
    return [stream(queue, b) for b in BANDS_DESC]


def parse_stream(key: str) -> tuple[str, int] | None:
    """Inverse of :func:`stream`: ``(queue, band)``, or None for other keys."""
    m = _BAND_STREAM_RE.match(key)
    return (m.group(1), int(m.group(2))) if m else None


def task(task_id: str) -> str:
    """Task record hash: ``dtq:task:<task_id>``."""
    return f"{PREFIX}task:{task_id}"


def result(task_id: str) -> str:
    """Result string: ``dtq:result:<task_id>``."""
    return f"{PREFIX}result:{task_id}"


def idempotency_digest(key: str) -> str:
    """SHA-256 hex of a user idempotency key (so any bytes map to a safe name)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def idempotency(queue: str, digest: str) -> str:
    """Idempotency record: ``dtq:idempotency:<queue>:<sha256 hex of the key>``.

    ``digest`` comes from :func:`idempotency_digest`. The queue name is validated
    and cannot contain ':' so (queue, key) pairs never collide.
    """
    return f"{PREFIX}idempotency:{queue}:{digest}"


def worker(worker_id: str) -> str:
    """Worker liveness hash: ``dtq:worker:<worker_id>``."""
    return f"{PREFIX}worker:{worker_id}"


def gateway_tag(gateway_id: str) -> str:
    """A key-safe tag of a gateway replica's id (DTQ_GATEWAY_ID is free text): the first
    16 hex characters of its SHA-256."""
    return hashlib.sha256(gateway_id.encode("utf-8")).hexdigest()[:16]


def gateway(tag: str) -> str:
    """Liveness of a gateway replica: ``dtq:gateway:<gateway_tag>`` (a string with a
    TTL that the replica refreshes). ``tag`` comes from :func:`gateway_tag`."""
    return f"{PREFIX}gateway:{tag}"


def queue_counters(queue: str) -> str:
    """Outcome counters of a queue (hash succeeded, retried, dead_lettered, cancelled;
    HINCRBY by ack.lua and fail.lua): ``dtq:queue:<queue>:counters``."""
    return f"{PREFIX}queue:{queue}:counters"


def paused(queue: str) -> str:
    """Pause flag of a queue: ``dtq:queue:<queue>:paused``."""
    return f"{PREFIX}queue:{queue}:paused"


def rate_limit(queue: str) -> str:
    """Rate limits of a queue and their token buckets: ``dtq:queue:<queue>:ratelimit``
    (a hash; one key per queue, so every limiter script touches one queue's keys)."""
    return f"{PREFIX}queue:{queue}:ratelimit"


def schedule(name: str) -> str:
    """A periodic schedule (definition and state): ``dtq:schedule:<name>`` (a hash).
    ``name`` matches :data:`SCHEDULE_RE`."""
    return f"{PREFIX}schedule:{name}"
def chain_pending(queue: str) -> str:
    """Sorted set of tasks of ``queue`` that succeeded with a chain step still to create:
    ``dtq:chains:pending:<queue>`` (member task id, score the ack's Redis time in ms)."""
    return f"{PREFIX}chains:pending:{queue}"


def groups_pending(queue: str) -> str:
    """Sorted set of unfinished groups whose callback goes to ``queue``:
    ``dtq:groups:pending:<queue>`` (member group id, score the next check's epoch ms)."""
    return f"{PREFIX}groups:pending:{queue}"


def group(queue: str, group_id: str) -> str:
    """Group record hash: ``dtq:group:<callback queue>:<group id>`` (group ids are 32 hex
    characters, queue names cannot contain ':')."""
    return f"{PREFIX}group:{queue}:{group_id}"
