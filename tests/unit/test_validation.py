"""Enqueue validation: defaults, limits, the field named in each error."""

from __future__ import annotations

import pytest

from dtq_gateway.domain.validation import cut_utf8, validate_enqueue
from dtq_gateway.errors import InvalidArgument, TooLarge
from dtq_gateway.settings import load
from dtq_gateway.store import keys
from dtq_proto import dtq_pb2 as pb

SETTINGS = load([], environ={"DTQ_MAX_PAYLOAD_BYTES": "100"})


def test_defaults_applied():
    t = validate_enqueue(pb.EnqueueRequest(queue="q", task_type="t"), SETTINGS)
    assert (t.priority, t.max_attempts, t.timeout_ms) == (5, 3, 60000)
    assert (t.backoff_base_ms, t.backoff_cap_ms) == (1000, 300000)
    assert t.content_type == "application/json" and keys.TASK_ID_RE.match(t.task_id)
    assert keys.task(t.task_id).startswith("dtq:task:{")
    assert t.idem_digest == "" and t.metadata_json == "{}"


def test_explicit_priority_zero_is_kept():
    t = validate_enqueue(pb.EnqueueRequest(queue="q", task_type="t", priority=0), SETTINGS)
    assert t.priority == 0


def test_non_json_content_type_skips_json_check():
    t = validate_enqueue(pb.EnqueueRequest(queue="q", task_type="t", payload=b"\xff\x00",
                                           content_type="application/octet-stream"), SETTINGS)
    assert t.payload == b"\xff\x00"


def test_payload_limit_is_resource_exhausted():
    with pytest.raises(TooLarge) as err:
        validate_enqueue(pb.EnqueueRequest(queue="q", task_type="t", payload=b"1" * 101),
                         SETTINGS)
    assert err.value.field == "payload"


@pytest.mark.parametrize("kwargs, field", [
    ({"payload": b"\xff"}, "payload"),
    ({"timeout_ms": 86_400_001}, "timeout_ms"),
    ({"expires_at_ms": 5, "ttl_ms": 5}, "ttl_ms"),
    ({"metadata": {"k": "v" * 2000}}, "metadata"),
    ({"idempotency_key": "k" * 300}, "idempotency_key"),
    ({"retry_policy": pb.RetryPolicy(backoff_base_ms=4_000_000)},
     "retry_policy.backoff_base_ms"),
    ({"task_type": "has space"}, "task_type"),
])
def test_bad_fields_are_named(kwargs, field):
    base = {"queue": "q", "task_type": "t"} | kwargs
    with pytest.raises(InvalidArgument) as err:
        validate_enqueue(pb.EnqueueRequest(**base), SETTINGS, prefix="items[2].")
    assert err.value.field == "items[2]." + field


@pytest.mark.parametrize(("text", "limit", "want"), [
    ("abc", 3, "abc"), ("abcd", 3, "abc"), ("é" * 3, 5, "éé"), ("é" * 3, 6, "ééé"),
    ("a€", 3, "a"), ("😀x", 4, "😀"), ("😀x", 3, ""), ("", 0, "")])
def test_cut_utf8_cuts_bytes_at_a_character_boundary(text, limit, want):
    assert cut_utf8(text, limit) == want
    assert len(cut_utf8(text, limit).encode()) <= limit


@pytest.mark.parametrize(("payload", "says"), [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"a": 1,}', "not valid JSON at line 1 column 9"),
    (b"NaN", "not valid JSON"),
    ('"é"'.encode("utf-16"), "must be UTF-8"),
])
def test_json_payload_errors_say_what_is_wrong(payload, says):
    settings = load([], environ={"DTQ_MAX_PAYLOAD_BYTES": str(1 << 20)})
    with pytest.raises(InvalidArgument) as err:
        validate_enqueue(pb.EnqueueRequest(queue="q", task_type="t", payload=payload), settings)
    assert says in err.value.message and err.value.field == "payload"


@pytest.mark.parametrize("payload", [
    b"1" * 5000, b"-" + b"9" * 10_000, b'{"n": ' + b"7" * 5000 + b', "f": 1e400}',
    b"[" + b"1" * 4301 + b", 0.5, -0]",
])
def test_json_integers_of_any_length_are_valid_json(payload):
    """RFC 8259 puts no bound on a number's digits; Python's int() refuses more than 4,300
    (sys.get_int_max_str_digits), which must not make the payload "not valid JSON"."""
    settings = load([], environ={"DTQ_MAX_PAYLOAD_BYTES": str(1 << 20)})
    t = validate_enqueue(pb.EnqueueRequest(queue="q", task_type="t", payload=payload), settings)
    assert t.payload == payload


@pytest.mark.parametrize("payload", [b"NaN", b"[1, Infinity]", b'{"x": -Infinity}',
                                     b"[" + b"1" * 5000 + b", NaN]"])
def test_json_nan_and_infinity_are_still_refused(payload):
    settings = load([], environ={"DTQ_MAX_PAYLOAD_BYTES": str(1 << 20)})
    with pytest.raises(InvalidArgument) as err:
        validate_enqueue(pb.EnqueueRequest(queue="q", task_type="t", payload=payload), settings)
    assert "not valid JSON" in err.value.message and err.value.field == "payload"


@pytest.mark.parametrize("policy", [
    pb.RetryPolicy(backoff_base_ms=100_000, backoff_cap_ms=1),
    pb.RetryPolicy(backoff_base_ms=600_000),  # above the default cap (300 s)
])
def test_a_backoff_cap_below_its_base_is_refused(policy):
    with pytest.raises(InvalidArgument) as err:
        validate_enqueue(pb.EnqueueRequest(queue="q", task_type="t", retry_policy=policy),
                         SETTINGS)
    assert err.value.field == "retry_policy.backoff_cap_ms"
    assert "at least backoff_base_ms" in err.value.message
