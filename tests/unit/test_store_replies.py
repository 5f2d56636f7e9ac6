"""Script wrappers decode their replies into typed values (issue 22): the decoders,
table-driven over each script's documented reply shapes."""

from __future__ import annotations

import pytest

from dtq_gateway.store.completion import LeaseOutcome, _outcomes, lease_outcome
from dtq_gateway.store.errors import ReplicasNotAcked


@pytest.mark.parametrize("reply, expected", [
    ([b"ok", b"100", b"50", b"250", b"cg"], LeaseOutcome("ok", "", 100, 250, "cg")),
    ([b"ok", 100, 50, 250, b""], LeaseOutcome("ok", "", 100, 250, "")),
    ([b"retry", b"scheduled", b"100", b"900", b"g"], LeaseOutcome("retry", "scheduled", 100)),
    ([b"dead", b"dead_lettered", b"100", b"0", b"g"],
     LeaseOutcome("dead", "dead_lettered", 100, 0, "g")),
    ([b"released", b"queued", b"100", b"0", b""], LeaseOutcome("released", "queued", 100)),
    ([b"cancelled", b"cancelled", b"7", b"0", b"g"],
     LeaseOutcome("cancelled", "cancelled", 7, 0, "g")),
    ([b"ok", b"100", b"50", b"250", b"", 1], LeaseOutcome("ok", "", 100, 250, "", True)),
    ([b"retry", b"scheduled", b"100", b"900", b"", b"0"],
     LeaseOutcome("retry", "scheduled", 100)),
    ([b"dup", b"succeeded"], LeaseOutcome("dup", "succeeded")),
    ([b"stale", b"missing"], LeaseOutcome("stale", "missing")),
])
def test_ack_and_fail_replies_decode(reply, expected) -> None:
    assert lease_outcome(reply) == expected


def test_errors_stay_in_place_and_unconfirmed_writes_carry_their_outcome() -> None:
    boom = ConnectionError("gone")
    out = _outcomes([[b"dup", b"succeeded"], boom,
                     ReplicasNotAcked(1, 0, 100, [b"stale", b"active"])])
    assert out[0] == LeaseOutcome("dup", "succeeded") and out[1] is boom
    assert isinstance(out[2], ReplicasNotAcked)
    assert (out[2].wanted, out[2].got, out[2].reply) == (1, 0, LeaseOutcome("stale", "active"))


def test_enqueue_reply_decodes_items_and_meta() -> None:
    from dtq_gateway.store.broker import EnqueueItem, EnqueueReply, enqueue_reply

    raw = [[b"ok", b"t1", b"queued"], [b"dup", b"t0", b"active"], [b"full", 10],
           [b"debounced", b"t9", b"scheduled"], [b"debounce_retry", b"t8"],
           [b"meta", 1000, 1, [b"1000", b"t1"]]]
    assert enqueue_reply(raw) == EnqueueReply(
        (EnqueueItem("ok", "t1", "queued"), EnqueueItem("dup", "t0", "active"),
         EnqueueItem("full"), EnqueueItem("debounced", "t9", "scheduled"),
         EnqueueItem("debounce_retry", "t8")), True, ("1000", "t1"))
    assert len(raw) == 6  # the raw reply is left as it was
    assert enqueue_reply([[b"ok", b"t1", b"queued"], [b"meta", 1, 0, [], 1]]) == \
        EnqueueReply((EnqueueItem("ok", "t1", "queued"),), False, (), trimmed=True)


@pytest.mark.parametrize("raw, kind, status", [
    ([b"cancelled"], "cancelled", ""), ([b"requested"], "requested", ""),
    ([b"terminal", b"succeeded"], "terminal", "succeeded"), ([b"missing"], "missing", "")])
def test_cancel_reply_decodes(raw, kind, status) -> None:
    from dtq_gateway.store.broker import CancelReply

    assert CancelReply.of(raw) == CancelReply(kind, status)


def test_cancel_matching_step_decodes() -> None:
    from dtq_gateway.store.bulk import CancelStep

    assert CancelStep.of([b"1-5", 100, 3, 2, 1, b"a", b"b", b"c"]) == \
        CancelStep("1-5", 100, 3, 2, 1, ("a", "b", "c"))
    assert CancelStep.of([b"", b"0", b"0", b"0", b"0"]) == CancelStep("", 0, 0, 0, 0, ())
