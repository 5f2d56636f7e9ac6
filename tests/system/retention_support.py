"""Helpers of the retention proof (tests/system/test_retention.py).

Three parts (the raw-stub worker is in retention_worker.py):

* the key table of ``docs/redis-layout.md``, parsed from the document itself and
  turned into one regex per row, so "no key outside the table" is checked against
  the table an operator reads, not against a copy of it (``key_families``);
* TTL probes: mark a key with a short TTL before a transition, assert after it
  that the gateway set the TTL back to the retention (``TtlProbe``);
* the walk: every key classified (``inventory``) and checked against its row's
  bound (``Bounds``, ``task_hash_problems``, ``ttl_problems``, ...).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from dtq_gateway.store import keys
from dtq_proto import dtq_pb2 as pb
from tests.support.leasing import poll

LAYOUT_DOC = Path(__file__).resolve().parents[2] / "docs" / "redis-layout.md"
DESIGN_DOC = LAYOUT_DOC.with_name("design.md")


def _body(rx: re.Pattern) -> str:
    """A whole-name pattern of keys.py without its anchors (^...\\Z)."""
    return rx.pattern.removeprefix("^").removesuffix("\\Z")


#: Placeholders of the table's key column and the names they stand for.
_PLACEHOLDERS = {
    "<queue>": _body(keys.QUEUE_RE),
    "<0-9>": "[0-9]",
    "<sha256(key)>": "[0-9a-f]{64}",
    "<tag>": "[0-9a-f]{16}",
    "<slot>": "[0-9a-z]{1,4}",
    "<name>": _body(keys.SCHEDULE_RE),
    "<callback queue>": _body(keys.QUEUE_RE),
    "<group id>": "[0-9a-f]{32}",
    "<key>": "[^\\x00-\\x1f]+",  # a concurrency key: any text without control characters
}
#: ``<id>`` names a worker in the worker row and a task everywhere else.
_WORKER_ID = _body(keys.WORKER_ID_RE)
_TASK_ID = _body(keys.TASK_ID_RE)
#: One key built by dtq_gateway.store.keys per family; each must match exactly one row.
FAMILY_EXAMPLES = {
    "band-stream": keys.stream("q-1", 7),
    "dead-letter": keys.dead_letter("q-1"),
    "audit": keys.AUDIT,
    "retry-schedule": keys.schedule("q-1"),
    "retry-claimed": keys.RETRY_CLAIMED,
    "task": keys.task("0" * 32 + "-9z"),
    "result": keys.result("0" * 32 + "-9z"),
    "idempotency": keys.idempotency("q-1", keys.idempotency_digest("k")),
    "debounce": keys.debounce("q-1", keys.idempotency_digest("k")),
    "worker": keys.worker("host-1:w@1"),
    "gateway": keys.gateway(keys.gateway_tag("gw-1")),
    "lease-secret": keys.LEASE_SECRET,
    "workers": keys.WORKERS,
    "paused": keys.paused("q-1"),
    "bands": keys.queue_bands("q-1"),
    "cancelled": keys.cancelled("q-1"),
    "expiring": keys.expiring("q-1"),
    "busy-marker": keys.busy_marker("q-1"),
    "dead-letter-queues": keys.DEAD_LETTER_QUEUES,
    "queue-counters": keys.queue_counters("q-1"),
    "queue-registry": keys.QUEUES,
    "registry-backfilled": keys.QUEUES_BACKFILLED,
    "recent": keys.RECENT_TASKS,
    "finished": keys.finished("q-1"),
    "scheduler-lock": keys.SCHEDULER_LOCK,
    "busy-queues": keys.BUSY_QUEUES,
    "chain-pending": keys.chain_pending("q-1"),
    "group": keys.group("q-1", "0" * 32),
    "groups-pending": keys.groups_pending("q-1"),
    "followup-queues": keys.FOLLOWUP_QUEUES,
    "events-channel": keys.EVENTS_CHANNEL,
    "schedule": keys.periodic_schedule("s-1"),
    "schedule-registry": keys.SCHEDULES,
    "rate-limit": keys.rate_limit("q-1"),
    "rate-limited-queues": keys.RATE_LIMITED_QUEUES,
    "schedule-names": keys.SCHEDULE_NAMES,
    "schedule-names-built": keys.SCHEDULE_NAMES_BUILT,
    "rate-limit-index": keys.RATE_LIMIT_INDEX,
    "rate-limit-index-built": keys.RATE_LIMIT_INDEX_BUILT,
    "history": keys.HISTORY,
    "queue-history": keys.history("q-1"),
    "conc-limit": keys.concurrency_limit("q-1"),
    "conc-active": keys.concurrency_active("q-1"),
    "conc-waiting": keys.concurrency_waiting("q-1"),
    "conc-parked": keys.concurrency_parked("q-1", "k"),
    "conc-limited-queues": keys.CONCURRENCY_LIMITED_QUEUES,
}
#: Statuses after which nothing happens to a task on its own.
TERMINAL = {pb.TASK_STATUS_SUCCEEDED, pb.TASK_STATUS_DEAD_LETTERED,
            pb.TASK_STATUS_CANCELLED, pb.TASK_STATUS_EXPIRED}


@dataclass(frozen=True)
class Family:
    """One row of the layout table.

    Attributes:
        name: family name (a key of FAMILY_EXAMPLES).
        pattern: the key column as written in the document.
        regex: compiled full-match regex of the key column.
        redis_type: Redis TYPE the row promises ("" for the pub/sub channel).
        fields: field names the row's "holds" column lists (empty when none).
    """

    name: str
    pattern: str
    regex: re.Pattern
    redis_type: str
    fields: frozenset[str] = frozenset()


def _row_regex(pattern: str) -> re.Pattern:
    out = re.escape(pattern)
    for placeholder, body in _PLACEHOLDERS.items():
        out = out.replace(re.escape(placeholder), f"(?:{body})")
    ident = _WORKER_ID if pattern.startswith(keys.worker("")) else _TASK_ID
    out = out.replace(re.escape("<id>"), f"(?:{ident})")
    return re.compile(f"^{out}$")


def layout_rows(doc: Path = LAYOUT_DOC) -> list[tuple[str, str, str]]:
    """``(key pattern, type column, holds column)`` of every row of the table in ``doc``."""
    rows = []
    for line in doc.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0].startswith(f"`{keys.PREFIX}"):
            rows.append((cells[0].strip("`"), cells[1], cells[2]))
    return rows


def listed_fields(text: str) -> frozenset[str]:
    """Field names of every backticked comma list in ``text`` ("`{a, b}`" -> {a, b})."""
    spans = [s for s in re.findall(r"`([^`]*)`", text) if "," in s]
    return frozenset(f.strip(" {}\n") for span in spans for f in span.split(","))


def entry_fields(doc: Path = DESIGN_DOC) -> frozenset[str]:
    """Fields of a band-stream entry, from the "Stream entry" section of ``doc``."""
    text = doc.read_text(encoding="utf-8")
    section = text[text.index("## Stream entry"):]
    return listed_fields(section[:section.index("`.") + 2])


def key_families(doc: Path = LAYOUT_DOC) -> dict[str, Family]:
    """The table's rows by family name (names from FAMILY_EXAMPLES).

    Raises:
        AssertionError: a family example matches no row or several rows, or a row is
            matched by no example (the table and dtq_gateway.store.keys disagree).
    """
    rows = [(p, t, h, _row_regex(p)) for p, t, h in layout_rows(doc)]
    families: dict[str, Family] = {}
    for name, example in FAMILY_EXAMPLES.items():
        hits = [row for row in rows if row[3].match(example)]
        assert len(hits) == 1, (f"keys.py builds {example!r} ({name}); it matches "
                                f"{len(hits)} rows of {doc.name}: {[h[0] for h in hits]}")
        pattern, type_col, holds, rx = hits[0]
        redis_type = "" if type_col.startswith("pub/sub") else type_col.split()[0]
        families[name] = Family(name, pattern, rx, redis_type, listed_fields(holds))
    unclaimed = {row[0] for row in rows} - {f.pattern for f in families.values()}
    assert not unclaimed, f"rows of {doc.name} no keys.py builder produces: {unclaimed}"
    return families


def classify(key: str, families: dict[str, Family]) -> list[str]:
    """Names of every family whose regex matches ``key`` (exactly one when valid)."""
    return [f.name for f in families.values() if f.regex.match(key)]


async def now_ms(r: aioredis.Redis) -> int:
    """Redis TIME in epoch ms (the clock the gateway stamps records with)."""
    sec, usec = await r.time()
    return int(sec) * 1000 + int(usec) // 1000


async def scan_all(r: aioredis.Redis, match: str = "*") -> list[str]:
    """Every key matching ``match`` (SCAN, never KEYS)."""
    return sorted([k.decode() async for k in r.scan_iter(match=match, count=1000)])


async def wait_until(fn: Callable[[], Awaitable[Any]], pred: Callable[[Any], bool],
                     what: str, timeout_s: float = 10.0) -> Any:
    """:func:`poll` that fails the test with ``what`` when the deadline passes."""
    try:
        return await poll(fn, pred, timeout_s=timeout_s)
    except TimeoutError as exc:
        raise AssertionError(f"{what}: {exc}") from None


async def orphaned_cancels(r: aioredis.Redis) -> list[str]:
    """Members of the cancelled set whose task has no stream entry left to absorb.

    A queued task cancelled before a worker saw its entry stays in the set until
    the lease path acks the entry away; a member without a live entry would stay
    forever.
    """
    orphans = []
    members = []
    for queue in await r.zrange(keys.QUEUES, 0, -1):
        members += await r.smembers(keys.cancelled(queue.decode()))
    for raw in members:
        task_id = raw.decode()
        queue, band, entry_id = await r.hmget(keys.task(task_id), "queue", "priority",
                                              "entry_id")
        live = bool(entry_id) and queue is not None and bool(await r.xrange(
            keys.stream(queue.decode(), int(band)), entry_id, entry_id))
        if not live:
            orphans.append(f"{task_id} (entry_id {entry_id!r})")
    return orphans


@dataclass
class TtlProbe:
    """Proves that a transition reset a key's TTL: lower it first, check it after.

    The marker TTL is far below the retention, so a PTTL back near the retention
    can only come from the gateway's EXPIRE in the transition's script.

    Attributes:
        r: Redis client of the test.
        retention_ms: the TTL the gateway must set (ms).
        marker_ms: the TTL the probe sets before the transition (ms).
        slack_ms: how far below retention_ms a fresh TTL may be (ms).
    """

    r: aioredis.Redis
    retention_ms: int
    marker_ms: int
    slack_ms: int = 3000

    async def mark(self, key: str) -> None:
        """Lower the TTL of ``key`` to the marker (the key must exist)."""
        assert await self.r.pexpire(key, self.marker_ms), f"{key} missing before marking"

    async def assert_fresh(self, key: str, what: str) -> int:
        """Assert PTTL of ``key`` is within slack of the retention; returns it (ms)."""
        pttl = await self.r.pttl(key)
        marker = f" (marker was {self.marker_ms} ms)" if self.marker_ms else ""
        assert self.retention_ms - self.slack_ms < pttl <= self.retention_ms, (
            f"{what}: PTTL of {key} is {pttl} ms, expected it (re)set to the retention "
            f"{self.retention_ms} ms{marker}")
        return pttl

    async def assert_kept(self, key: str, what: str) -> int:
        """Assert the TTL of ``key`` was kept (0 < PTTL <= marker); returns it (ms)."""
        pttl = await self.r.pttl(key)
        assert 0 < pttl <= self.marker_ms, (
            f"{what}: PTTL of {key} is {pttl} ms, expected the earlier TTL kept "
            f"(<= marker {self.marker_ms} ms, and not -1 = TTL lost)")
        return pttl

    async def assert_live(self, key: str, what: str) -> None:
        """Assert ``key`` has no TTL: a live task record (queued, scheduled, active)."""
        pttl = await self.r.pttl(key)
        assert pttl == -1, (f"{what}: PTTL of {key} is {pttl} ms, expected no TTL "
                            f"(-1): a live task record must not expire")

    @contextlib.asynccontextmanager
    async def persisted(self, key: str, what: str) -> AsyncIterator[None]:
        """Mark ``key`` on entry; on exit assert the transition left it live (TTL gone)."""
        await self.mark(key)
        yield
        await self.assert_live(key, what)

    @contextlib.asynccontextmanager
    async def refreshed(self, key: str, what: str) -> AsyncIterator[None]:
        """Mark ``key`` on entry; on exit assert the body's transition reset its TTL."""
        await self.mark(key)
        yield
        await self.assert_fresh(key, what)


@dataclass(frozen=True)
class Bounds:
    """What the table promises, in the units the checks use.

    Attributes:
        task_ms: task hash TTL, DTQ_TASK_RETENTION_S (ms).
        result_ms: result TTL, DTQ_RESULT_RETENTION_S (ms).
        idem_ms: idempotency record TTL, DTQ_IDEM_TTL_S (ms).
        worker_ms: worker hash TTL, 3 x the heartbeat interval (ms).
        lock_ms: scheduler lock PX (ms).
        dlq_maxlen: approximate MAXLEN of the dead-letter stream (entries).
        audit_maxlen: approximate MAXLEN of the audit stream (entries).
        recent_max: size of the recent-tasks zset (entries).
        node_max: stream-node-max-entries of the server: ``MAXLEN ~`` trims whole
            nodes only, so a trimmed stream may exceed its MAXLEN by this much.
    """

    task_ms: int
    result_ms: int
    idem_ms: int
    worker_ms: int
    lock_ms: int
    dlq_maxlen: int
    audit_maxlen: int
    recent_max: int
    node_max: int


async def inventory(r: aioredis.Redis, families: dict[str, Family]) -> dict[str, list[str]]:
    """SCAN every key, assert each is in exactly one row and has the row's type.

    Returns:
        Keys by family name.
    """
    every = await scan_all(r)
    outside = [k for k in every if not k.startswith(keys.PREFIX)]
    assert not outside, f"keys outside the {keys.PREFIX!r} prefix: {outside}"
    by_family: dict[str, list[str]] = {name: [] for name in families}
    unknown, ambiguous, mistyped = [], [], []
    for key in every:
        names = classify(key, families)
        if not names:
            unknown.append(key)
        elif len(names) > 1:
            ambiguous.append((key, names))
        else:
            by_family[names[0]].append(key)
            actual = (await r.type(key)).decode()
            if actual != families[names[0]].redis_type:
                mistyped.append((key, actual, families[names[0]].redis_type))
    assert not unknown, (f"{len(unknown)} keys match no row of the layout table "
                         f"(first 20): {unknown[:20]}")
    assert not ambiguous, f"keys matching several rows of the layout table: {ambiguous}"
    assert not mistyped, f"keys whose TYPE differs from the table (key, is, table): {mistyped}"
    return by_family


#: Entry fields only some band-stream entries carry (docs/design.md, "Stream entry").
OPTIONAL_ENTRY_FIELDS = frozenset({"queued_at", "idem_digest"})


async def field_problems(r: aioredis.Redis, stream: str, expected: frozenset[str],
                         count: int = 50,
                         optional: frozenset[str] = OPTIONAL_ENTRY_FIELDS) -> list[str]:
    """The newest ``count`` entries of ``stream`` whose field names are not ``expected``
    (fields in ``optional`` may be absent)."""
    problems = []
    for entry_id, entry in await r.xrevrange(stream, count=count):
        got = {f.decode() for f in entry}
        if got - expected or (expected - optional) - got:
            problems.append(f"{stream} {entry_id.decode()}: extra {sorted(got - expected)}, "
                            f"missing {sorted(expected - optional - got)}")
    if len(problems) > 3:
        problems[3:] = [f"... and {len(problems) - 3} more entries like these"]
    return problems


async def ttl_problems(r: aioredis.Redis, names: list[str], low_ms: int,
                       high_ms: int) -> list[str]:
    """Keys whose PTTL is outside ``(low_ms, high_ms]`` (-1 = no TTL, -2 = gone)."""
    problems = []
    for key in names:
        pttl = await r.pttl(key)
        if pttl != -2 and not low_ms < pttl <= high_ms:
            problems.append(f"{key}: PTTL {pttl} ms not in ({low_ms}, {high_ms}]")
    return problems


async def task_hash_problems(r: aioredis.Redis, names: list[str], task_ms: int,
                             tolerance_ms: int = 1500) -> list[str]:
    """Task hashes whose TTL breaks the retention rule.

    A live record (queued, scheduled, active) has no TTL. The script that moves a task
    to a terminal state stamps ``updated_at_ms`` and sets ``EXPIRE retention`` together,
    so a terminal record's remaining TTL must equal the retention minus the age of that
    update: a write that forgot the EXPIRE leaves no TTL or an older one.
    """
    problems = []
    now = await now_ms(r)
    for key in names:
        pttl = await r.pttl(key)
        status, updated = await r.hmget(key, "status", "updated_at_ms")
        if pttl == -2:
            continue
        if status in (b"queued", b"scheduled", b"active"):
            if pttl != -1:
                problems.append(f"{key}: live ({status!r}) but PTTL {pttl} ms")
            continue
        if not 0 < pttl <= task_ms or updated is None:
            problems.append(f"{key}: PTTL {pttl} ms, updated_at_ms {updated}")
            continue
        expected = task_ms - (now - int(updated))
        if abs(pttl - expected) > tolerance_ms:
            problems.append(f"{key}: PTTL {pttl} ms but last update {now - int(updated)} ms "
                            f"ago implies {expected} ms: TTL not refreshed by the last write")
    return problems


async def stream_rest_problems(r: aioredis.Redis, streams: list[str]) -> list[str]:
    """Band streams holding entries, lacking the one ``workers`` group, or with a PEL."""
    problems = []
    for key in streams:
        length = await r.xlen(key)
        groups = await r.xinfo_groups(key)
        names = [g["name"].decode() for g in groups]
        pending = sum(int(g["pending"]) for g in groups)
        if length or pending or names != [keys.GROUP]:
            problems.append(f"{key}: XLEN {length}, groups {names}, pending {pending}")
    return problems
