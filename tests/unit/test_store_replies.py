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
