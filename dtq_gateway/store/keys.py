"""Every Redis key name dtq uses, built in this one module.

The layout follows docs/redis-layout.md. No other module concatenates key strings, and
Lua scripts receive every key through KEYS.

**One layout for a standalone Redis and for Redis Cluster.** Every key of one queue
carries the queue name as its hash tag (``dtq:stream:{emails}:p9``), so it lives in the
queue's hash slot and every script, which touches the keys of one queue only, runs on
one cluster node. A task's record and result carry a *slot tag* instead: a short string
whose hash slot is the queue's (:func:`slot_tag`), which the gateway puts into the task
id it makes (``<32 hex>-<tag>``), so GetTask, CancelTask and Ack, which get only the task
id, still name keys in the queue's slot. The worker records and gateway liveness keys
share the ``{workers}`` slot. The few keys that span queues (the audit stream, the
recent-tasks index, the queue registry and busy set, the scheduler lock, the
dead-letter queue index) are written only by single-key commands.

User-supplied strings that end up inside a key are either validated against a
restricted alphabet (queue names, worker ids, task ids) or hashed (idempotency
keys), so two different inputs can never build the same key. dtq's own deduplication
keys (schedule fires, chain steps, group callbacks) are hashed in a domain of their
own (:func:`internal_idempotency_digest`), so no client key reaches their records.
Queue names cannot hold ``{``, ``}`` or ``:``, so the hash tag of a queue key is
exactly the queue name.
"""

from __future__ import annotations

import hashlib
import re

# The alphabets, slot tags and digests live in the domain's leaf module; the key layout
# offers them too (keys.QUEUE_RE, keys.slot_tag, ...), as its callers have always used them.
from dtq_gateway.domain.names import (  # noqa: F401 (re-exported)
    QUEUE_RE,
    SCHEDULE_RE,
    TASK_ID_RE,
    TASK_TYPE_RE,
    WORKER_ID_RE,
    idempotency_digest,
    internal_idempotency_digest,
    key_slot,
    new_task_id,
    slot_tag,
)

PREFIX = "dtq:"

#: Consumer group created on every band stream.
GROUP = "workers"
#: Consumer name the reaper claims expired entries to.
REAPER_CONSUMER = "dtq-reaper"
#: Priority bands, highest first (the order leasing drains them).
BANDS_DESC = tuple(range(9, -1, -1))

#: Hash tag of every worker and gateway-liveness key (one slot: worker_beat and
#: worker_sweep touch a worker's record and the registry together).
WORKERS_TAG = "{workers}"

AUDIT = PREFIX + "stream:audit"
#: Reserved by the layout; dtq never writes it (each move is one script).
RETRY_CLAIMED = PREFIX + "retry:claimed"
WORKERS = PREFIX + "workers:" + WORKERS_TAG
RECENT_TASKS = PREFIX + "tasks:recent"
#: History samples of all queues together (a list, newest first; store/history.py).
HISTORY = PREFIX + "history"
SCHEDULER_LOCK = PREFIX + "lock:scheduler"
#: Set of queue names that may hold work: entries in their band streams (queued or
#: leased) or scheduled tasks. Written by single-key commands only (SADD after a
#: script reported that it made the queue busy, SREM by the reaper followed by a
#: re-check); see docs/redis-layout.md, "Idle queues".
BUSY_QUEUES = PREFIX + "queues:busy"
#: Sorted set (all scores 0, ordered by name) of every queue a gateway ever created
#: groups for: ListQueues pages through it with ZRANGEBYLEX instead of SCANning keys.
QUEUES = PREFIX + "queues"
#: String set once the registry (and the busy set) were rebuilt from a SCAN of the band
#: streams (the one-time backfill for data written before they existed; see groups.py).
QUEUES_BACKFILLED = PREFIX + "queues:backfilled"
#: Set of queue names whose dead-letter stream may hold entries (SADD before any call
#: that may dead-letter a task of the queue; never removed): ListDeadLetters reads these
#: queues' streams.
DEAD_LETTER_QUEUES = PREFIX + "queues:dead-letter"
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
#: Index of schedule names for ListSchedules: sorted set, every score 0, so
#: ZRANGEBYLEX pages through it by name (the registry above is scored by next fire).
#: Single-key commands only, written after the registry; see schedules.py.
SCHEDULE_NAMES = PREFIX + "schedules:names"
#: "1" once SCHEDULE_NAMES was built from the registry (schedules made before it existed).
SCHEDULE_NAMES_BUILT = PREFIX + "schedules:names:built"
#: Index of every rate limit for ListRateLimits and DTQ_MAX_RATE_LIMITS: sorted set,
#: every score 0, member ``<queue> <scope>`` (scope ``*`` = queue-wide, else the task
#: type; a space sorts before every character of both alphabets, so ZRANGEBYLEX pages
#: by queue, then scope, the queue-wide limit first). See ratelimits.py.
RATE_LIMIT_INDEX = PREFIX + "ratelimits:index"
#: "1" once RATE_LIMIT_INDEX was built from the limits stored before it existed.
RATE_LIMIT_INDEX_BUILT = PREFIX + "ratelimits:index:built"
#: Set of queue names that may hold chain or group follow-up work (the keys of
#: :func:`chain_pending` and :func:`groups_pending`): the follow-up sweep reads only
#: these queues. Global, so only ever touched by single-key SADD / SMEMBERS; a name is
#: added before the first task or group that could need it is stored.
FOLLOWUP_QUEUES = PREFIX + "followups:queues"
#: Pub/sub channel (not a key) for lifecycle events.
EVENTS_CHANNEL = PREFIX + "events"

#: SCAN pattern matching every band stream of every queue.
BAND_STREAM_PATTERN = PREFIX + "stream:{*}:p[0-9]"
_BAND_STREAM_RE = re.compile(r"^dtq:stream:\{([A-Za-z0-9_.-]{1,64})\}:p([0-9])\Z")
def _task_tag(task_id: str) -> str:
    """``{<slot tag>}:`` of a task id, or "" for an untagged (older) id."""
    _, sep, tag = task_id.partition("-")
    return f"{{{tag}}}:" if sep else ""


def stream(queue: str, band: int) -> str:
    """Band stream of a queue: ``dtq:stream:{<queue>}:p<band>``, band 0..9."""
    return f"{PREFIX}stream:{{{queue}}}:p{band}"


def dead_letter(queue: str) -> str:
    """Dead-letter stream of a queue: ``dtq:stream:{<queue>}:dead-letter``."""
    return f"{PREFIX}stream:{{{queue}}}:dead-letter"


def schedule(queue: str) -> str:
    """Scheduled tasks of a queue (delayed tasks and retries), a zset scored by due
    time: ``dtq:retry:{<queue>}:schedule``."""
    return f"{PREFIX}retry:{{{queue}}}:schedule"


def cancelled(queue: str) -> str:
    """Set of the queue's tasks cancelled while their entry was read but not yet
    activated: ``dtq:cancelled:{<queue>}``."""
    return f"{PREFIX}cancelled:{{{queue}}}"


def expiring(queue: str) -> str:
    """Expiry index of a queue's waiting tasks that have an expiry and never started, a
    zset of task ids scored by ``expires_at_ms``: ``dtq:expiring:{<queue>}``. The
    scheduler leader expires the due members, so depth and backlog age count live work
    only."""
    return f"{PREFIX}expiring:{{{queue}}}"


def finished(queue: str) -> str:
    """Finished-task index of a queue for DTQ_KEEP_FINISHED, a zset of the ids of its
    succeeded and cancelled tasks scored by finish time in microseconds (Redis TIME):
    ``dtq:finished:{<queue>}``.
    Written (and trimmed to the newest N) only while DTQ_KEEP_FINISHED is set."""
    return f"{PREFIX}finished:{{{queue}}}"


def busy_marker(queue: str) -> str:
    """``dtq:queue:{<queue>}:busy``: "1" while the queue may hold work (set by the
    scripts that add work to an idle queue, deleted by the reaper's script that found
    it idle); the queue's side of :data:`BUSY_QUEUES`."""
    return f"{PREFIX}queue:{{{queue}}}:busy"


def queue_streams_desc(queue: str) -> list[str]:
    """The ten band streams of a queue, p9 first."""
    return [stream(queue, b) for b in BANDS_DESC]


def parse_stream(key: str) -> tuple[str, int] | None:
    """Inverse of :func:`stream`: ``(queue, band)``, or None for other keys."""
    m = _BAND_STREAM_RE.match(key)
    return (m.group(1), int(m.group(2))) if m else None


def task(task_id: str) -> str:
    """Task record hash: ``dtq:task:{<slot tag>}:<task_id>`` (``dtq:task:<task_id>`` for
    an untagged id of the older layout)."""
    return f"{PREFIX}task:{_task_tag(task_id)}{task_id}"


def result(task_id: str) -> str:
    """Result string: ``dtq:result:{<slot tag>}:<task_id>`` (untagged like
    :func:`task`)."""
    return f"{PREFIX}result:{_task_tag(task_id)}{task_id}"


def idempotency(queue: str, digest: str) -> str:
    """Idempotency record: ``dtq:idempotency:{<queue>}:<sha256 hex of the key>``.

    ``digest`` comes from :func:`idempotency_digest`. The queue name is validated
    and cannot contain ':' so (queue, key) pairs never collide.
    """
    return f"{PREFIX}idempotency:{{{queue}}}:{digest}"


def debounce(queue: str, digest: str) -> str:
    """Debounce record: ``dtq:debounce:{<queue>}:<sha256 hex of the key>`` (a JSON
    string {task_id, first_ms, until_ms}, with a TTL; enqueue.lua owns it).

    ``digest`` comes from :func:`idempotency_digest`; the record lives in the
    queue's hash slot, beside the tasks it points at.
    """
    return f"{PREFIX}debounce:{{{queue}}}:{digest}"


def worker(worker_id: str) -> str:
    """Worker liveness hash: ``dtq:worker:{workers}:<worker_id>``."""
    return f"{PREFIX}worker:{WORKERS_TAG}:{worker_id}"


def gateway_tag(gateway_id: str) -> str:
    """A key-safe tag of a gateway replica's id (DTQ_GATEWAY_ID is free text): the first
    16 hex characters of its SHA-256."""
    return hashlib.sha256(gateway_id.encode("utf-8")).hexdigest()[:16]


def gateway(tag: str) -> str:
    """Liveness of a gateway replica: ``dtq:gateway:{workers}:<gateway_tag>`` (a string
    with a TTL that the replica refreshes). ``tag`` comes from :func:`gateway_tag`."""
    return f"{PREFIX}gateway:{WORKERS_TAG}:{tag}"


def queue_counters(queue: str) -> str:
    """Outcome counters of a queue (hash succeeded, retried, dead_lettered, cancelled;
    HINCRBY by ack.lua, fail.lua, reclaim.lua (a lost lease retried, dead-lettered or
    ended cancelled) and, for cancelled, the cancel scripts):
    ``dtq:queue:{<queue>}:counters``."""
    return f"{PREFIX}queue:{{{queue}}}:counters"


def history(queue: str) -> str:
    """History samples of one queue (a list, newest first; store/history.py):
    ``dtq:history:{<queue>}``."""
    return f"{PREFIX}history:{{{queue}}}"


def queue_bands(queue: str) -> str:
    """Band summary of a queue: ``dtq:queue:{<queue>}:bands``, a set of the band digits
    whose streams may hold entries plus ``*`` once lease_take rebuilt it; 1 s TTL.
    Written by the Lua scripts only (``bands_key`` in _lib.lua builds the same name)."""
    return f"{PREFIX}queue:{{{queue}}}:bands"


def paused(queue: str) -> str:
    """Pause flag of a queue: ``dtq:queue:{<queue>}:paused``."""
    return f"{PREFIX}queue:{{{queue}}}:paused"


def rate_limit(queue: str) -> str:
    """Rate limits of a queue and their token buckets: ``dtq:queue:{<queue>}:ratelimit``
    (a hash; one key per queue, so every limiter script touches one queue's keys)."""
    return f"{PREFIX}queue:{{{queue}}}:ratelimit"


def periodic_schedule(name: str) -> str:
    """A periodic schedule (definition and state): ``dtq:schedule:<name>`` (a hash in its
    own slot, touched only by single-key commands and one-key scripts). ``name`` matches
    :data:`SCHEDULE_RE`."""
    return f"{PREFIX}schedule:{name}"


def chain_pending(queue: str) -> str:
    """Sorted set of tasks of ``queue`` that succeeded with a chain step still to create:
    ``dtq:chains:pending:{<queue>}`` (member task id, score the ack's Redis time in ms)."""
    return f"{PREFIX}chains:pending:{{{queue}}}"


def groups_pending(queue: str) -> str:
    """Sorted set of unfinished groups whose callback goes to ``queue``:
    ``dtq:groups:pending:{<queue>}`` (member group id, score the next check's epoch ms)."""
    return f"{PREFIX}groups:pending:{{{queue}}}"


def group(queue: str, group_id: str) -> str:
    """Group record hash: ``dtq:group:{<callback queue>}:<group id>`` (group ids are 32
    hex characters, queue names cannot contain ':')."""
    return f"{PREFIX}group:{{{queue}}}:{group_id}"


#: Set of the queue names that have a per-key concurrency limit (ListConcurrencyLimits;
#: single-key commands only, see store/concurrency.py).
CONCURRENCY_LIMITED_QUEUES = PREFIX + "conc:limits"


def concurrency_limit(queue: str) -> str:
    """Per-key concurrency limit of a queue (a string: the most active tasks per
    concurrency key): ``dtq:conc:{<queue>}:limit``. lua/_concurrency.lua builds the
    same names (tests/redis/test_concurrency_keys.py checks that they agree)."""
    return f"{PREFIX}conc:{{{queue}}}:limit"


def concurrency_active(queue: str) -> str:
    """Active tasks per concurrency key of a queue: ``dtq:conc:{<queue>}:active`` (a hash
    key -> count; a field is deleted when its count reaches 0)."""
    return f"{PREFIX}conc:{{{queue}}}:active"


def concurrency_waiting(queue: str) -> str:
    """Parked tasks per concurrency key of a queue: ``dtq:conc:{<queue>}:waiting`` (a hash
    key -> count; a field is deleted when its count reaches 0)."""
    return f"{PREFIX}conc:{{{queue}}}:waiting"


def concurrency_parked(queue: str, ckey: str) -> str:
    """Task ids parked under one concurrency key, oldest first:
    ``dtq:conc:{<queue>}:parked:<key>`` (a list; deleted by Redis when empty)."""
    return f"{PREFIX}conc:{{{queue}}}:parked:{ckey}"
