"""Throughput from the cumulative outcome counters: rate between two readings."""

from __future__ import annotations

from dtq_gateway.queue_rates import KEEP_MS, QueueRates


def test_first_reading_has_no_rate_then_rates_per_second():
    rates = QueueRates()
    assert rates.observe("q", 10_000, 100, 4).window_ms == 0
    assert rates.observe("q", 10_400, 120, 4).window_ms == 0  # under 1 s: no rate yet
    rate = rates.observe("q", 12_000, 300, 8)
    assert (rate.succeeded_per_s, rate.failed_per_s, rate.window_ms) == (100.0, 2.0, 2_000)


def test_readings_older_than_the_window_are_forgotten():
    rates = QueueRates()
    rates.observe("q", 0, 0, 0)
    rates.observe("q", 30_000, 3_000, 0)
    rate = rates.observe("q", KEEP_MS + 30_000, 9_000, 0)
    assert rate.window_ms == KEEP_MS and rate.succeeded_per_s == 100.0


def test_queues_are_separate_and_a_counter_reset_reads_zero():
    rates = QueueRates()
    rates.observe("a", 0, 50, 0)
    rates.observe("b", 0, 0, 0)
    assert rates.observe("a", 1_000, 10, 0).succeeded_per_s == 0.0  # counters were reset
    assert rates.observe("b", 1_000, 5, 0).succeeded_per_s == 5.0
