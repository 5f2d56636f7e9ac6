"""The typed lease replies (store/lease_replies.py): decoding and merging, no Redis."""

from __future__ import annotations

import pytest

from dtq_gateway.store import keys
from dtq_gateway.store.lease_replies import (
    Activation,
    ActivationKind,
    LeaseRead,
    WorkerState,
)
from dtq_gateway.store.leasing import SlotRead
from dtq_gateway.store.ratelimits import Limits


def test_activation_decodes_ok_and_the_other_kinds() -> None:
    ok = Activation.decode([b"ok", b"text/plain", b'{"a": 1}', b"5", 7])
    assert (ok.kind, ok.content_type, ok.metadata(), ok.created_at_ms, ok.leased_at_ms) == (
        ActivationKind.OK, "text/plain", {"a": 1}, 5, 7)
    assert Activation.decode([b"expired"]) == Activation(ActivationKind.EXPIRED)
    assert Activation.decode([b"ok", b"", b"", None, 3]).metadata() == {}


def test_activation_of_unknown_kind_is_an_error() -> None:
    with pytest.raises(ValueError):
        Activation.decode([b"bogus"])


def test_a_slot_read_decodes_indexes_into_streams_queues_and_bands() -> None:
    read = SlotRead.of(["a", "b"])
    reply = [3, [4], 0, 2, [25, [2], [1, 2], [1]], 0,
             [3, b"1-0", [b"task_id", b"x-1", b"attempt", b"2"], [b"read"]]]
    got = read.decode(reply)
    assert (got.pending, got.missing_streams, got.live_streams, got.worker_state) == (
        3, [keys.stream("b", 8)], 2, WorkerState.OK)
    assert got.limits == Limits(25, {"b"}, {"a", "b"}, {"a"})
    (entry,) = got.entries
    assert (entry.stream, entry.queue, entry.band, entry.entry_id, entry.task_id,
            entry.attempt, entry.activation.kind) == (
        keys.stream("a", 8), "a", 8, "1-0", "x-1", 2, ActivationKind.READ)
    assert entry.queued_at_ms == 1


def test_a_peek_reports_the_live_streams_and_no_entries() -> None:
    read = SlotRead.of(["a"]).band(4)
    got = read.decode([0, [], 0, 1, [0, [], [], []], 0, [1]], peek=True)
    assert got.entries == [] and got.live == [keys.stream("a", 4)]
    # a take that checked its worker and found it stalled: nothing read, no live list
    stalled = read.decode([2, [], 0, 1, [0, [], [], []], 1])
    assert (stalled.worker_state, stalled.entries, stalled.pending) == (
        WorkerState.STALLED, [], 2)


def test_merge_sums_counts_keeps_the_earliest_wake_up_and_takes_the_state() -> None:
    def one(pending: int, wait_ms: int, throttled: set[str]) -> LeaseRead:
        return LeaseRead(pending, [], WorkerState.OK, 1,
                         Limits(wait_ms, set(), set(throttled), set(throttled)))
    merged = LeaseRead.merge([one(1, 0, set()), one(2, 30, {"a"}), one(0, 20, {"b"})],
                             WorkerState.STALLED)
    assert (merged.pending, merged.live_streams, merged.worker_state) == (
        3, 3, WorkerState.STALLED)
    assert merged.limits == Limits(20, set(), {"a", "b"}, {"a", "b"})
    assert LeaseRead.merge([one(1, 0, set())], pending=9).pending == 9
