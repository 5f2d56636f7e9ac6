"""The events channel's message formats: batch (one message per script call) and single."""

from __future__ import annotations

import json

import pytest

from dtq_gateway.events.events_wire import decode, iso_ms

PREFIX = "0123456789abcdef01234567"
TS_MS = 1796062800123  # 2026-11-30T18:20:00.123Z


def batch(*events: list, ts_ms: object = TS_MS, prefix: object = PREFIX) -> bytes:
    return json.dumps({"ts_ms": ts_ms, "id_prefix": prefix, "events": list(events)}).encode()


def test_iso_ms_matches_the_lua_format() -> None:
    assert iso_ms(TS_MS) == "2026-11-30T18:20:00.123Z"
    assert iso_ms(0) == "1970-01-01T00:00:00.000Z"
    assert iso_ms(951782400007) == "2000-02-29T00:00:00.007Z"  # leap day


def test_batch_expands_to_one_event_per_element_in_order() -> None:
    events = decode(batch(
        ["TASK_QUEUED", "t1", "q1", "send", 1, "", None],
        ["TASK_FAILED", "t2", "q2", "send", 2, "w1", {"error": "boom", "error_class": "E"}],
        ["WORKER_STARTED", "", "", "", 0, "w9", None]))
    assert events == [
        {"event_id": PREFIX + "00000001", "ts": "2026-11-30T18:20:00.123Z",
         "type": "TASK_QUEUED", "task_id": "t1", "queue": "q1", "task_type": "send",
         "attempt": 1, "worker_id": ""},
        {"event_id": PREFIX + "00000002", "ts": "2026-11-30T18:20:00.123Z",
         "type": "TASK_FAILED", "task_id": "t2", "queue": "q2", "task_type": "send",
         "attempt": 2, "worker_id": "w1", "metadata": {"error": "boom", "error_class": "E"}},
        {"event_id": PREFIX + "00000003", "ts": "2026-11-30T18:20:00.123Z",
         "type": "WORKER_STARTED", "task_id": "", "queue": "", "task_type": "",
         "attempt": 0, "worker_id": "w9"}]


def test_event_ids_count_positions_past_eight_bits() -> None:
    events = decode(batch(*[["TASK_QUEUED", f"t{i}", "q", "x", 1, "", None]
                            for i in range(300)]))
    assert [e["event_id"][-8:] for e in events][254:257] == ["000000ff", "00000100", "00000101"]


def test_short_elements_and_odd_values_are_tolerated() -> None:
    """cjson drops trailing nils of a Lua array; numbers may arrive as floats."""
    [short, odd] = decode(batch(["TASK_CANCELLED", "t1", "q1"],
                                ["TASK_RETRIED", 7, None, "x", "3", "w", []], ts_ms=1.0e3))
    assert short == {"event_id": PREFIX + "00000001", "ts": "1970-01-01T00:00:01.000Z",
                     "type": "TASK_CANCELLED", "task_id": "t1", "queue": "q1",
                     "task_type": "", "attempt": 0, "worker_id": ""}
    assert (odd["task_id"], odd["queue"], odd["attempt"], "metadata" in odd) == (
        "7", "", 3, False)


def test_bad_elements_are_skipped_but_keep_their_position() -> None:
    events = decode(batch(["TASK_QUEUED", "t1", "q", "x", 1, "", None], "junk", [],
                          [5, "t"], ["TASK_QUEUED", "t5", "q", "x", 1, "", None]))
    assert [e["event_id"][-2:] for e in events] == ["01", "05"]


def test_empty_lua_table_is_no_events() -> None:
    assert decode(json.dumps({"ts_ms": TS_MS, "id_prefix": PREFIX, "events": {}})) == []


def test_single_event_objects_pass_unchanged() -> None:
    old = {"event_id": "e1", "ts": "2026-01-01T00:00:00.000Z", "type": "TASK_QUEUED",
           "task_id": "t1", "queue": "q1", "task_type": "x", "attempt": 1, "worker_id": ""}
    assert decode(json.dumps(old)) == [old]
    assert decode(json.dumps(old).encode()) == [old]


@pytest.mark.parametrize("raw", [
    b"not json", b"[1, 2]", b'"text"',
    batch(["TASK_QUEUED"], ts_ms="soon"), batch(["TASK_QUEUED"], ts_ms=True),
    batch(["TASK_QUEUED"], ts_ms=10 ** 20), batch(["TASK_QUEUED"], prefix=None),
    json.dumps({"ts_ms": TS_MS, "id_prefix": PREFIX, "events": "x"}).encode()])
def test_malformed_messages_decode_to_none(raw: bytes) -> None:
    assert decode(raw) is None
