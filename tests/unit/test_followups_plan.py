"""Validation of chains, groups, trace context and progress reports (no I/O)."""

from __future__ import annotations

import json

import pytest

from dtq_gateway.domain.followup_plan import MAX_CHAIN_STEPS, plan_chain, plan_group, step_task_id
from dtq_gateway.domain.validation import validate_enqueue
from dtq_gateway.errors import InvalidArgument
from dtq_gateway.leasing.completion import _progress
from dtq_gateway.settings import load
from dtq_gateway.store import keys
from dtq_proto import dtq_pb2 as pb

SETTINGS = load([], environ={})
TP = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"


def req(**kw) -> pb.EnqueueRequest:
    return pb.EnqueueRequest(queue=kw.pop("queue", "q"), task_type="t", **kw)


def test_chain_ids_are_derived_and_the_steps_stored():
    r = req(chain=[req(queue="q2"), req()])
    task, ids = plan_chain(r, validate_enqueue(r, SETTINGS), SETTINGS)
    second = step_task_id(task.task_id, "q2")
    assert ids == [second, step_task_id(second, "q")]
    assert keys.key_slot(keys.task(second)) == keys.key_slot(keys.stream("q2", 0))
    fields = json.loads(task.extra_json)
    assert fields[:6] == ["follow", "c", "chain_id", task.task_id, "chain_step", "0"]
    assert len(json.loads(fields[7])) == 2


@pytest.mark.parametrize(("step", "field"), [
    (req(idempotency_key="k"), "items[0].chain[0].idempotency_key"),
    (req(traceparent=TP), "items[0].chain[0].traceparent"),
    (req(queue="bad queue"), "items[0].chain[0].queue"),
])
def test_bad_chain_steps_name_their_field(step, field):
    r = req(chain=[step])
    with pytest.raises(InvalidArgument) as err:
        plan_chain(r, validate_enqueue(r, SETTINGS), SETTINGS, prefix="items[0].")
    assert err.value.field == field


def test_chain_length_is_bounded():
    r = req(chain=[req()] * (MAX_CHAIN_STEPS + 1))
    with pytest.raises(InvalidArgument) as err:
        plan_chain(r, validate_enqueue(r, SETTINGS), SETTINGS)
    assert err.value.field == "chain"


def test_group_members_carry_the_group():
    members = [validate_enqueue(req(), SETTINGS) for _ in range(2)]
    group_id, planned = plan_group(req(queue="cb"), members, SETTINGS)
    assert json.loads(planned[1].extra_json) == ["follow", "g", "group_id", group_id,
                                                 "group_queue", "cb"]


def test_trace_context_from_the_field_or_the_call():
    meta = json.loads(validate_enqueue(req(traceparent=TP, tracestate="a=b"), SETTINGS)
                      .metadata_json)
    assert (meta["traceparent"], meta["tracestate"]) == (TP, "a=b")
    from_call = validate_enqueue(req(), SETTINGS, trace=(TP, ""))
    assert json.loads(from_call.metadata_json) == {"traceparent": TP}
    ignored = validate_enqueue(req(), SETTINGS, trace=("garbage", ""))
    assert ignored.metadata_json == "{}"
    with pytest.raises(InvalidArgument) as err:
        validate_enqueue(req(traceparent="00-zz"), SETTINGS)
    assert err.value.field == "traceparent"


@pytest.mark.parametrize(("percent", "message", "want"), [
    (42.5, "x", ("42.5", "x")), (250, "", ("100", "")), (-1, "", ("0", "")),
    (float("nan"), "x", ("", "")), (33.333, "é" * 200, ("33.33", "é" * 128)),
])
def test_progress_reports_are_clamped_and_cut(percent, message, want):
    assert _progress(pb.TaskProgress(percent=percent, message=message)) == want
