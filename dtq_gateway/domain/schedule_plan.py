"""Periodic schedules: the definition and the timetable (no I/O).

A schedule fires on a cron expression read in an IANA time zone (parsed by the
``cronsim`` library, daylight-saving changes included) or every ``interval_ms``
from an anchor (its creation time). :func:`plan` decides which fires are due at
``now_ms`` given the time up to which every fire is already handled (``done_ms``),
applying the missed-fire policy:

* a fire at most :data:`ON_TIME_MS` late is "on time" and is always enqueued (this
  covers a scheduler leader failover, which takes up to the lock TTL);
* an older fire was missed (no gateway ran, Redis was unreachable): SKIP drops it,
  LATEST enqueues the newest missed fire once (only when no fire is on time), ALL
  enqueues the newest ``catch_up_max_fires`` missed fires, oldest first. LATEST and
  ALL ignore fires older than ``catch_up_max_age_ms``.

Fires are computed backwards from ``now_ms``, so the work is bounded by the fires
returned (at most :data:`MAX_ON_TIME` + ``catch_up_max_fires``), never by the length
of an outage.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from dtq_gateway.domain import names
from dtq_gateway.errors import InvalidArgument
from dtq_proto import dtq_pb2 as pb

#: A fire at most this late is on time whatever the policy (ms).
ON_TIME_MS = 30_000
#: A fire enqueued more than this after its fire time is counted late (ms): two firer
#: ticks (dtq_schedule_fires_late_total).
LATE_MS = 1000
#: Most missed fires of a cron schedule counted per round (an interval schedule's are
#: computed, not counted one by one).
MAX_MISSED_COUNTED = 1000
#: Most on-time fires enqueued in one round (an interval of 1 s after a 30 s stall).
MAX_ON_TIME = 32
MIN_INTERVAL_MS = 1000
MAX_INTERVAL_MS = 366 * 86_400_000
DEFAULT_MAX_FIRES = 10
MAX_FIRES = 1000
DEFAULT_MAX_AGE_MS = 86_400_000
#: The usual cron nicknames, spelled out (cronsim takes the 5-field form).
NICKNAMES = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
             "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
             "@hourly": "0 * * * *"}
SKIP, LATEST, ALL = (pb.SCHEDULE_CATCH_UP_SKIP, pb.SCHEDULE_CATCH_UP_LATEST,
                     pb.SCHEDULE_CATCH_UP_ALL)


@dataclass(frozen=True, slots=True)
class Timetable:
    """When a schedule fires: ``cron`` in ``tz``, or every ``interval_ms`` from
    ``anchor_ms`` (epoch ms)."""

    cron: str = ""
    tz: str = "UTC"
    interval_ms: int = 0
    anchor_ms: int = 0

    def _cron(self, start: datetime, reverse: bool = False) -> CronSim:
        return CronSim(NICKNAMES.get(self.cron.strip().lower(), self.cron), start,
                       reverse=reverse)

    def _zone(self) -> ZoneInfo | timezone:
        return UTC if self.tz == "UTC" else ZoneInfo(self.tz)

    def before(self, now_ms: int) -> Iterator[int]:
        """Fires at or before ``now_ms``, newest first (epoch ms)."""
        if self.interval_ms:
            if now_ms < self.anchor_ms:
                return iter(())
            last = self.anchor_ms + (now_ms - self.anchor_ms) // self.interval_ms * \
                self.interval_ms
            return itertools.takewhile(lambda f: f >= self.anchor_ms,
                                       itertools.count(last, -self.interval_ms))
        # cronsim is exclusive: start just after now_ms (cron has whole minutes)
        start = datetime.fromtimestamp(now_ms // 1000 + 1, self._zone())
        return (int(dt.timestamp() * 1000) for dt in self._cron(start, reverse=True))

    def next_after(self, now_ms: int) -> int:
        """The first fire strictly after ``now_ms`` (epoch ms)."""
        if self.interval_ms:
            if now_ms < self.anchor_ms:
                return self.anchor_ms
            return self.anchor_ms + ((now_ms - self.anchor_ms) // self.interval_ms + 1) * \
                self.interval_ms
        start = datetime.fromtimestamp(now_ms // 1000, self._zone())
        for dt in self._cron(start):
            fire = int(dt.timestamp() * 1000)
            if fire > now_ms:
                return fire
        raise AssertionError("unreachable")  # pragma: no cover - CronSim never ends


@dataclass(frozen=True, slots=True)
class Policy:
    """Missed-fire policy (see the module docstring)."""

    catch_up: int = SKIP
    max_fires: int = DEFAULT_MAX_FIRES
    max_age_ms: int = DEFAULT_MAX_AGE_MS


def plan(table: Timetable, policy: Policy, done_ms: int, now_ms: int) -> list[int]:
    """The fires to enqueue now, oldest first: due fires after ``done_ms`` (every fire
    at or before it is handled), filtered by the missed-fire policy."""
    on_time: list[int] = []
    missed: list[int] = []
    horizon = now_ms - (ON_TIME_MS if policy.catch_up == SKIP else
                        max(policy.max_age_ms, ON_TIME_MS))
    missed_by_policy: dict[int, int] = {SKIP: 0, LATEST: 1, ALL: policy.max_fires}
    want_missed = missed_by_policy.get(policy.catch_up, 0)
    for fire in table.before(now_ms):
        if fire <= done_ms or fire < horizon:
            break
        if now_ms - fire <= ON_TIME_MS:
            if len(on_time) < MAX_ON_TIME:
                on_time.append(fire)
            continue
        if len(missed) >= want_missed:
            break
        missed.append(fire)
    if policy.catch_up == LATEST and on_time:
        missed = []
    return sorted(missed + on_time)


def due_count(table: Timetable, done_ms: int, now_ms: int) -> int:
    """How many fires fall after ``done_ms`` and at or before ``now_ms`` (epoch ms):
    computed for an interval schedule, counted (at most MAX_MISSED_COUNTED +
    MAX_ON_TIME) for a cron schedule. Minus the fires :func:`plan` returned, this is
    the number of missed fires the policy dropped."""
    if table.interval_ms:
        first = max(done_ms + 1, table.anchor_ms)
        if now_ms < first:
            return 0
        # fires anchor + k*interval with first <= fire <= now
        k_lo = -(-(first - table.anchor_ms) // table.interval_ms)
        k_hi = (now_ms - table.anchor_ms) // table.interval_ms
        return max(0, k_hi - k_lo + 1)
    cap = MAX_MISSED_COUNTED + MAX_ON_TIME
    return sum(1 for _ in itertools.islice(
        itertools.takewhile(lambda f: f > done_ms, table.before(now_ms)), cap))


def timetable_of(spec: pb.Schedule, anchor_ms: int) -> Timetable:
    """The timetable of a validated spec."""
    if spec.interval_ms:
        return Timetable(interval_ms=spec.interval_ms, anchor_ms=anchor_ms)
    return Timetable(cron=spec.cron, tz=spec.timezone or "UTC")


def policy_of(spec: pb.Schedule) -> Policy:
    """The missed-fire policy of a validated spec, defaults applied."""
    return Policy(spec.catch_up or SKIP, spec.catch_up_max_fires or DEFAULT_MAX_FIRES,
                  spec.catch_up_max_age_ms or DEFAULT_MAX_AGE_MS)


def validate_spec(spec: pb.Schedule, prefix: str = "schedule.") -> None:
    """Check a schedule definition (not its task template, see schedules.py).

    Raises:
        InvalidArgument: naming the field, e.g. ``schedule.cron``.
    """
    def bad(field: str, why: str) -> InvalidArgument:
        return InvalidArgument(f"{prefix}{field}: {why}", field=prefix + field)

    if not names.SCHEDULE_RE.match(spec.name):
        raise bad("name", "must match [A-Za-z0-9_.-]{1,64}")
    if bool(spec.cron) == bool(spec.interval_ms):
        raise bad("cron", "exactly one of cron and interval_ms is required")
    if spec.interval_ms:
        if spec.timezone:
            raise bad("timezone", "applies to cron schedules only")
        if not MIN_INTERVAL_MS <= spec.interval_ms <= MAX_INTERVAL_MS:
            raise bad("interval_ms", f"must be {MIN_INTERVAL_MS}..{MAX_INTERVAL_MS}")
    else:
        try:
            zone: ZoneInfo | timezone = ZoneInfo(spec.timezone) if spec.timezone else \
                UTC
        except (ZoneInfoNotFoundError, ValueError):
            raise bad("timezone", "unknown IANA time zone") from None
        try:
            Timetable(cron=spec.cron)._cron(datetime.now(zone))
        except (CronSimError, StopIteration, ValueError) as exc:
            raise bad("cron", f"not a valid cron expression ({exc})") from None
    if spec.catch_up not in (0, SKIP, LATEST, ALL):
        raise bad("catch_up", "unknown policy")
    if spec.catch_up_max_fires > MAX_FIRES:
        raise bad("catch_up_max_fires", f"at most {MAX_FIRES}")
    if spec.catch_up_max_age_ms > MAX_INTERVAL_MS:
        raise bad("catch_up_max_age_ms", f"at most {MAX_INTERVAL_MS}")
