"""Session receipts (stream health): the unread window and cumulative confirmation."""

from __future__ import annotations

from dtq_gateway.leasing.sessions import WINDOW_MIN, WINDOW_UNSAID, Session


def _session(concurrency: int = 0) -> Session:
    return Session(worker_id="w", queues=["q"], max_in_flight=100, concurrency=concurrency,
                   read_by_slot=False)


def test_window_is_twice_concurrency_at_least_the_minimum():
    assert _session(1).window == WINDOW_MIN == 4
    assert _session(2).window == 4
    assert _session(0).window == WINDOW_UNSAID == 16  # concurrency not said
    assert _session(8).window == 16


def test_a_receipt_confirms_its_lease_and_every_lease_written_before_it():
    s = _session(1)
    for i, lid in enumerate(["a", "b", "c", "d"]):
        s.handed(lid, float(i))
    assert s.window_room() == 0 and s.read_cap(256) == 1
    assert not s.confirm(["x", "unknown"], 10.0)  # names nothing of this stream
    assert s.receipt_at == 0.0
    assert s.confirm(["c"], 11.0)  # a stream delivers in order: a and b arrived too
    assert list(s.unread) == ["d"] and s.receipt_at == 11.0
    assert s.window_room() == 3 and s.read_cap(256) == 1  # concurrency 1 reads one


def test_reads_take_at_most_the_room_left_in_the_window():
    s = _session(2)
    s.handed("a", 0.0)
    s.out.put_nowait(object())
    assert s.window_room() == 2 and s.read_cap(256) == 2


def _stall_after(**env: str) -> float:
    from dtq_gateway.leasing.dispatch import Dispatcher
    from dtq_gateway.settings import load

    settings = load([], environ={"DTQ_HEARTBEAT_INTERVAL_S": "1",
                                 "DTQ_VISIBILITY_TIMEOUT_S": "30", **env})

    async def release(ids):
        return None

    return Dispatcher(None, settings, None, release).health.stall_after_s


def test_stall_after_is_heartbeat_intervals_at_most_half_the_visibility_timeout():
    assert _stall_after() == 2.0  # DTQ_LEASE_STALL_HEARTBEATS defaults to 2
    assert _stall_after(DTQ_LEASE_STALL_HEARTBEATS="5") == 5.0
    assert _stall_after(DTQ_LEASE_STALL_HEARTBEATS="40") == 15.0
    assert _stall_after(DTQ_LEASE_STALL_HEARTBEATS="0") == float("inf")  # never


def test_a_negative_stall_setting_is_refused():
    import pytest

    from dtq_gateway.settings import SettingsError

    with pytest.raises(SettingsError, match="DTQ_LEASE_STALL_HEARTBEATS must be >= 0"):
        _stall_after(DTQ_LEASE_STALL_HEARTBEATS="-1")


def test_a_session_whose_max_in_flight_fits_its_window_reads_by_credit_alone():
    s = Session(worker_id="w", queues=["q"], max_in_flight=8, concurrency=4,
                read_by_slot=False)  # window 8
    for i in range(8):
        s.handed(f"l{i}", 0.0)
    assert s.window_room() == 8 and s.read_cap(256) == 4
