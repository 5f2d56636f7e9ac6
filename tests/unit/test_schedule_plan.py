"""The schedule timetable and missed-fire policy (schedule_plan.py), no I/O."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from dtq_gateway.domain.schedule_plan import (
    ALL,
    LATEST,
    ON_TIME_MS,
    SKIP,
    Policy,
    Timetable,
    plan,
    validate_spec,
)
from dtq_gateway.errors import InvalidArgument
from dtq_proto import dtq_pb2 as pb

H = 3_600_000
T0 = 1_800_000_000_000 - 1_800_000_000_000 % H  # an hour mark (UTC)


def ms(text: str, tz: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(tz)).timestamp() * 1000)


def test_interval_fires_from_the_anchor() -> None:
    table = Timetable(interval_ms=1000, anchor_ms=T0 + 300)
    assert table.next_after(T0) == T0 + 300
    assert table.next_after(T0 + 300) == T0 + 1300
    assert plan(table, Policy(), T0 + 300, T0 + 2500) == [T0 + 1300, T0 + 2300]


def test_cron_in_a_time_zone_follows_daylight_saving() -> None:
    # 02:30 every day in Berlin: on 2026-03-29 02:30 does not exist (clocks jump to 03:00)
    table = Timetable(cron="30 2 * * *", tz="Europe/Berlin")
    first = table.next_after(ms("2026-03-27T12:00", "Europe/Berlin"))
    assert first == ms("2026-03-28T02:30", "Europe/Berlin")
    after = table.next_after(ms("2026-03-29T04:00", "Europe/Berlin"))
    assert after == ms("2026-03-30T02:30", "Europe/Berlin")
    assert after - first == 2 * 86_400_000 - H  # one hour shorter across the change


def test_on_time_fires_fire_whatever_the_policy() -> None:
    table = Timetable(interval_ms=10_000, anchor_ms=T0)
    now = T0 + 25_000  # fires at +10 s and +20 s are late by 15 s and 5 s: on time
    assert plan(table, Policy(SKIP), T0, now) == [T0 + 10_000, T0 + 20_000]


@pytest.mark.parametrize("policy, expected_hours", [
    (Policy(SKIP), []),
    (Policy(LATEST), [5]),
    (Policy(ALL, max_fires=10), [1, 2, 3, 4, 5]),
    (Policy(ALL, max_fires=2), [4, 5]),
    (Policy(ALL, max_fires=10, max_age_ms=3 * H), [3, 4, 5]),
])
def test_missed_fire_policy(policy: Policy, expected_hours: list[int]) -> None:
    table = Timetable(cron="0 * * * *")
    now = T0 + 5 * H + 10 * 60_000  # 10 minutes after the fifth hour: all fires missed
    assert plan(table, policy, T0, now) == [T0 + h * H for h in expected_hours]


def test_latest_is_not_added_to_an_on_time_fire() -> None:
    table = Timetable(cron="0 * * * *")
    assert plan(table, Policy(LATEST), T0, T0 + 3 * H + ON_TIME_MS // 2) == [T0 + 3 * H]


def test_a_long_outage_costs_only_the_fires_returned() -> None:
    table = Timetable(interval_ms=1000, anchor_ms=0)
    assert len(plan(table, Policy(ALL, max_fires=5, max_age_ms=10**12), 0, T0)) == 5 + 31


@pytest.mark.parametrize("spec, field", [
    (pb.Schedule(name="bad name", interval_ms=1000), "schedule.name"),
    (pb.Schedule(name="s"), "schedule.cron"),
    (pb.Schedule(name="s", cron="* * * * *", interval_ms=1000), "schedule.cron"),
    (pb.Schedule(name="s", cron="61 * * * *"), "schedule.cron"),
    (pb.Schedule(name="s", cron="* * * * *", timezone="Mars/Olympus"), "schedule.timezone"),
    (pb.Schedule(name="s", interval_ms=999), "schedule.interval_ms"),
    (pb.Schedule(name="s", interval_ms=1000, timezone="UTC"), "schedule.timezone"),
    (pb.Schedule(name="s", interval_ms=1000, catch_up_max_fires=1001),
     "schedule.catch_up_max_fires"),
])
def test_bad_specs_name_their_field(spec: pb.Schedule, field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        validate_spec(spec)
    assert err.value.field == field


def test_due_count_counts_the_fires_between_done_and_now() -> None:
    """due_count is what plan() chooses from: computed for intervals, counted (with a
    cap) for cron, so the firer can count the missed fires the policy drops."""
    from dtq_gateway.domain.schedule_plan import (
        MAX_MISSED_COUNTED,
        MAX_ON_TIME,
        Timetable,
        due_count,
    )

    every_s = Timetable(interval_ms=1000, anchor_ms=10_000)
    assert due_count(every_s, 10_000, 15_000) == 5  # 11..15 s: the anchor is handled
    assert due_count(every_s, 0, 15_000) == 6  # the anchor itself fires
    assert due_count(every_s, 12_500, 12_999) == 0
    assert due_count(every_s, 0, 10 ** 12) == (10 ** 12 - 10_000) // 1000 + 1  # computed
    minutely = Timetable(cron="* * * * *")
    assert due_count(minutely, 0, 3_600_000) == 60
    assert due_count(minutely, 60_000, 180_000) == 2
    assert due_count(minutely, 0, 10 ** 12) == MAX_MISSED_COUNTED + MAX_ON_TIME  # capped
