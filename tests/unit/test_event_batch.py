"""event_batch.expand: one channel message per script call back into per-event dicts."""

from __future__ import annotations

import json

import pytest

from dtq_gateway.event_batch import expand, iso_ms

PREFIX = "ab" * 12


def batch(*events: list, ts_ms: int = 1_764_526_800_123) -> bytes:
    return json.dumps({"ts_ms": ts_ms, "id_prefix": PREFIX, "events": list(events)}).encode()


def test_iso_ms_is_utc_with_milliseconds() -> None:
    assert iso_ms(1_764_526_800_123) == "2025-11-30T18:20:00.123Z"
    assert iso_ms(0) == "1970-01-01T00:00:00.000Z"
    assert iso_ms(951_782_400_007) == "2000-02-29T00:00:00.007Z"  # leap day


def test_batch_expands_in_order_with_positional_event_ids() -> None:
    raw = batch(["TASK_QUEUED", "t1", "q", "send", 1, "", None],
                ["TASK_FAILED", "t2", "q", "send", 2, "w1", {"error": "boom", "error_class": "E"}])
    first, second = expand(raw)
    assert first == {"event_id": PREFIX + "00000001", "ts": "2025-11-30T18:20:00.123Z",
                     "type": "TASK_QUEUED", "task_id": "t1", "queue": "q",
                     "task_type": "send", "attempt": 1, "worker_id": ""}
    assert second["event_id"] == PREFIX + "00000002"
    assert (second["type"], second["worker_id"], second["attempt"]) == ("TASK_FAILED", "w1", 2)
    assert second["metadata"] == {"error": "boom", "error_class": "E"}


def test_single_event_object_passes_through() -> None:
    """The shape published before batching still decodes (mixed-version upgrade)."""
    old = {"event_id": "x1", "ts": "2025-11-30T18:20:00.123Z", "type": "WORKER_STARTED",
           "task_id": "", "queue": "", "task_type": "", "attempt": 0, "worker_id": "w"}
    assert expand(json.dumps(old)) == [old]


@pytest.mark.parametrize("raw", [b"[]", b"1", b'"s"', b'{"no": "type"}',
                                 b'{"events": [1, ["too", "short"]], "id_prefix": "p"}'])
def test_messages_without_events_expand_to_nothing(raw: bytes) -> None:
    assert expand(raw) == []


def test_not_json_raises_value_error() -> None:
    with pytest.raises(ValueError):
        expand(b"{not json")
