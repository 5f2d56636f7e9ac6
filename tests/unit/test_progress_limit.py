"""The per-lease bound on progress reports (dtq_gateway.leasing.progress_limit)."""

from __future__ import annotations

from dtq_gateway.leasing import progress_limit
from dtq_gateway.leasing.progress_limit import ProgressLimiter


def test_two_per_second_per_lease_with_a_burst_of_two():
    now = [0.0]
    lim = ProgressLimiter(clock=lambda: now[0])
    assert [lim.allow("a") for _ in range(5)] == [True, True, False, False, False]
    assert lim.allow("b")  # another lease has its own bucket
    now[0] += 0.5
    assert [lim.allow("a") for _ in range(2)] == [True, False]
    now[0] += 10
    assert [lim.allow("a") for _ in range(3)] == [True, True, False]  # never beyond burst


def test_idle_buckets_are_forgotten_and_the_count_is_bounded(monkeypatch):
    now = [0.0]
    lim = ProgressLimiter(clock=lambda: now[0])
    for i in range(100):
        lim.allow(f"l{i}")
    assert len(lim) == 100
    now[0] += progress_limit.IDLE_S
    lim.allow("x")
    assert len(lim) == 1
    monkeypatch.setattr(progress_limit, "MAX_LEASES", 10)
    for i in range(50):
        lim.allow(f"m{i}")
    assert len(lim) == 10
