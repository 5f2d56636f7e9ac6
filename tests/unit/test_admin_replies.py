"""Admin script wrappers decode their replies into typed values (issue 22): the
decoders, table-driven over each script's documented reply shapes."""

from __future__ import annotations

import pytest

from dtq_gateway.store.admin import PauseReply, QueueSummary
from dtq_gateway.store.admin_dlq import DeadLetterReply, DlqRow
from dtq_gateway.store.admin_waiting import WaitingReply, WaitingRow
from dtq_gateway.store.audit import AuditRecord
from dtq_gateway.store.concurrency import ConcurrencySetReply
from dtq_gateway.store.history import OutcomeDeltas
from dtq_gateway.store.queue_delete import DeleteQueueReply
from dtq_gateway.store.ratelimits import RateLimitSetReply, TokenGrant
from dtq_gateway.store.schedules import Advance
from dtq_gateway.store.task_groups import GroupProgress


@pytest.mark.parametrize("raw, expected", [
    ([b"OK", b"1700", b"1700-0", 1], DeadLetterReply("OK", 1700, became_busy=True)),
    ([b"OK", 1700, b"1700-0", b"0"], DeadLetterReply("OK", 1700)),
    ([b"OK", b"1800"], DeadLetterReply("OK", 1800)),  # discard_dead_letter.lua
    ([b"NOT_FOUND"], DeadLetterReply("NOT_FOUND")),
    ([b"NO_ENTRY"], DeadLetterReply("NO_ENTRY")),
    ([b"MISMATCH"], DeadLetterReply("MISMATCH")),
    ([b"WRONG_STATE", b"queued"], DeadLetterReply("WRONG_STATE", detail="queued")),
    ([b"WRONG_STATE", b""], DeadLetterReply("WRONG_STATE")),
    ([b"KEY_TAKEN", b"t2"], DeadLetterReply("KEY_TAKEN", detail="t2")),
])
def test_dead_letter_reply_decodes(raw, expected) -> None:
    assert DeadLetterReply.of(raw) == expected


@pytest.mark.parametrize("raw, expected", [
    ([], []),
    ([b"5-0", b"t1", b"q", b"email", b"Boom", b"5", b"3"],
     [DlqRow("5-0", "t1", "q", "email", "Boom", 5, 3)]),
    ([b"5-0", b"t1", b"q", b"", b"", b"", b"", b"6-1", b"t2", b"r", b"x", b"E", 6, 1],
     [DlqRow("5-0", "t1", "q", "", "", 0, 0), DlqRow("6-1", "t2", "r", "x", "E", 6, 1)]),
])
def test_dlq_scan_page_decodes(raw, expected) -> None:
    assert DlqRow.decode_page(raw) == expected


@pytest.mark.parametrize("raw, expected", [
    ([0, 1], WaitingReply(0, True)),
    ([b"2000", b"0", [b"email", b"3", b"100"]],
     WaitingReply(2000, False, (WaitingRow("email", 3, 100),))),
    ([4, 1, [b"gpu", 4, 50, b'{"gpu":"a100"}'], [b"x", 1, 60, b""],
      [b"y", 1, 70, b"[1]"]],
     WaitingReply(4, True, (WaitingRow("gpu", 4, 50, {"gpu": "a100"}),
                            WaitingRow("x", 1, 60), WaitingRow("y", 1, 70)))),
])
def test_queue_waiting_reply_decodes(raw, expected) -> None:
    assert WaitingReply.of(raw) == expected


@pytest.mark.parametrize("raw, expected", [
    ([0, 0, 0], ConcurrencySetReply(0, 0, False)),
    ([3, 1000, 1], ConcurrencySetReply(3, 1000, True)),
    ([b"5", b"2", b"0"], ConcurrencySetReply(5, 2, False)),
])
def test_concurrency_set_reply_decodes(raw, expected) -> None:
    assert ConcurrencySetReply.of(raw) == expected


@pytest.mark.parametrize("raw, expected", [
    ([b"1700-0", 1700], AuditRecord("1700-0", 1700)),
    (["1700-1", b"1700"], AuditRecord("1700-1", 1700)),
])
def test_audit_append_reply_decodes(raw, expected) -> None:
    assert AuditRecord.of(raw) == expected


@pytest.mark.parametrize("raw, expected", [
    ([b"not_empty", 4, 1, 2, 0, 0, []], DeleteQueueReply("not_empty", 4, 1, 2, 0, 0, ())),
    ([b"dead_letters", 0, 0, 0, 0, 7, [b"k1"]],
     DeleteQueueReply("dead_letters", 0, 0, 0, 0, 7, ("k1",))),
    ([b"absent", 0, 0, 0, 0, 0, []], DeleteQueueReply("absent", 0, 0, 0, 0, 0, ())),
    ([b"deleted", b"0", b"0", b"0", b"1", b"2", [b"a", b"b"]],
     DeleteQueueReply("deleted", 0, 0, 0, 1, 2, ("a", "b"))),
])
def test_delete_queue_reply_decodes(raw, expected) -> None:
    assert DeleteQueueReply.of(raw) == expected


@pytest.mark.parametrize("raw, expected", [
    ([b"created", 0], RateLimitSetReply("created", False)),
    ([b"changed", b"0"], RateLimitSetReply("changed", False)),
    ([b"deleted", 1], RateLimitSetReply("deleted", True)),
    ([b"missing", 1], RateLimitSetReply("missing", True)),
])
def test_rate_limit_set_reply_decodes(raw, expected) -> None:
    assert RateLimitSetReply.of(raw) == expected


@pytest.mark.parametrize("raw, expected", [
    ([], []),
    ([[3, 0]], [TokenGrant(3, 0)]),
    ([[1, 250], [b"0", b"0"]], [TokenGrant(1, 250), TokenGrant(0, 0)]),
])
def test_rate_take_reply_decodes(raw, expected) -> None:
    assert TokenGrant.decode_all(raw) == expected


@pytest.mark.parametrize("raw, expected, finished", [
    ([1, 3], GroupProgress(1, 3), False),
    ([3, 3], GroupProgress(3, 3), True),
    ([b"2", b"0"], GroupProgress(2, 0), False),  # group still being created
    ([-1, 0], GroupProgress(-1, 0), False),  # group record gone
])
def test_group_member_reply_decodes(raw, expected, finished) -> None:
    assert GroupProgress.of(raw) == expected
    assert GroupProgress.of(raw).finished is finished


@pytest.mark.parametrize("raw, expected", [
    ([0, 0, 0], OutcomeDeltas()),
    ([5, 2, 1], OutcomeDeltas(5, 2, 1)),
    ([b"7", b"", b"3"], OutcomeDeltas(7, 0, 3)),
    (ConnectionError("gone"), OutcomeDeltas()),  # a failed call in the pipeline
])
def test_history_counters_reply_decodes(raw, expected) -> None:
    assert OutcomeDeltas.of(raw) == expected


@pytest.mark.parametrize("raw, expected", [
    ([1, 1700], PauseReply(True, 1700)),
    ([b"0", b"1700"], PauseReply(False, 1700)),
])
def test_pause_queue_reply_decodes(raw, expected) -> None:
    assert PauseReply.of(raw) == expected


@pytest.mark.parametrize("row, expected", [
    ([0, 0, 0], QueueSummary("q", 0, 0, False)),
    ([12, 3, 1], QueueSummary("q", 12, 3, True)),
    ([b"5", b"0", b"0"], QueueSummary("q", 5, 0, False)),
])
def test_queue_summaries_item_decodes(row, expected) -> None:
    assert QueueSummary.of("q", row) == expected


@pytest.mark.parametrize("raw, expected", [
    (b"ok", Advance.OK), (b"gone", Advance.GONE), ("stale", Advance.STALE),
    (b"paused", Advance.PAUSED)])
def test_schedule_advance_reply_decodes(raw, expected) -> None:
    assert Advance.of(raw) is expected


def test_an_unknown_schedule_advance_reply_is_an_error() -> None:
    with pytest.raises(ValueError):
        Advance.of(b"what")
