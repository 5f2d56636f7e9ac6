"""Dashboard pieces without I/O: throughput window, Host check, decoding, arguments,
settings, and a clear error for a taken port."""

from __future__ import annotations

import socket

import pytest

from dtq_gateway.errors import InvalidArgument
from dtq_gateway.settings import SettingsError, load
from dtq_gateway.web.dashboard import Dashboard, host_allowed
from dtq_gateway.web.dashboard_api import Backend, decode_bytes, int_arg, str_arg
from dtq_gateway.web.dashboard_rates import RateTracker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rates_count_the_last_window_per_queue():
    clock = Clock()
    rates = RateTracker(window_s=60, clock=clock)
    for etype in ("TASK_QUEUED", "TASK_SUCCEEDED", "TASK_SUCCEEDED", "TASK_FAILED",
                  "TASK_DEAD_LETTERED", "TASK_STARTED"):
        rates.on_event({"type": etype, "queue": "q"})
    rates.on_event({"type": "TASK_SUCCEEDED", "queue": "other"})
    rates.on_event({"type": "TASK_SUCCEEDED"})  # no queue: ignored
    got = rates.rates("q")
    assert (got.enqueued, got.succeeded, got.failed, got.dead_lettered) == (1, 2, 1, 1)
    assert got.as_dict()["succeeded_per_min"] == 2.0
    clock.now += 30
    rates.on_event({"type": "TASK_SUCCEEDED", "queue": "q"})
    assert rates.rates("q").succeeded == 3
    clock.now += 31  # the first second left the window
    assert rates.rates("q").succeeded == 1
    assert rates.rates("never").succeeded == 0


def test_rates_do_not_count_a_parked_task_going_back_as_an_enqueue():
    rates = RateTracker(window_s=60, clock=Clock())
    rates.on_event({"type": "TASK_QUEUED", "queue": "q"})
    rates.on_event({"type": "TASK_QUEUED", "queue": "q",
                    "metadata": {"reason": "unparked", "concurrency_key": "k"}})
    assert rates.rates("q").enqueued == 1


def test_rates_track_a_bounded_number_of_queues():
    rates = RateTracker(max_queues=2, clock=Clock())
    for q in ("a", "b", "a", "c"):  # "b" is the longest idle when "c" arrives
        rates.count(q, 1)
    assert (rates.rates("a").succeeded, rates.rates("b").succeeded,
            rates.rates("c").succeeded) == (2, 0, 1)


def test_rates_raw_prefilter():
    rates = RateTracker()
    assert rates.wants_raw(b'{"events":[["TASK_SUCCEEDED","id","q"]]}')
    assert not rates.wants_raw(b'{"events":[["TASK_STARTED","id","q"]]}')


@pytest.mark.parametrize(("host", "ok"), [
    ("127.0.0.1:8080", True), ("[::1]:8080", True), ("localhost:1", True),
    ("10.1.2.3", True), ("dash.localhost", True), ("evil.example:8080", False),
    ("", False), (socket.gethostname(), True), ("dtq.internal", True),
])
def test_host_check_against_dns_rebinding(host, ok):
    assert host_allowed(host, "dtq.internal") is ok


def test_decode_bytes_json_text_and_binary():
    assert decode_bytes(b'{"a":1}', "application/json")["value"] == {"a": 1}
    assert decode_bytes(b'{"a":1}', "application/cloudevents+json")["encoding"] == "json"
    assert decode_bytes(b"plain", "text/plain") == {"bytes": 5, "encoding": "text",
                                                   "value": "plain"}
    assert decode_bytes(b"not json", "")["encoding"] == "text"
    assert decode_bytes(b"\xff\x00", "application/octet-stream")["value"] == "/wA="
    assert decode_bytes(b"")["encoding"] == "empty"
    cut = decode_bytes(b'{"a":"' + "é".encode() * 10 + b'"}', "application/json", max_bytes=9)
    assert cut == {"bytes": 28, "encoding": "text", "truncated": True,
                   "value": '{"a":"é\ufffd'}


def test_argument_rules_name_the_field():
    assert int_arg(None, "limit", 7, 1, 10) == 7
    assert int_arg("3", "limit", 7, 1, 10) == 3
    for bad in ("x", "11", True, 1.5, [1]):
        with pytest.raises(InvalidArgument) as err:
            int_arg(bad, "limit", 7, 1, 10)
        assert err.value.field == "limit"
    with pytest.raises(InvalidArgument) as err:
        str_arg(5, "reason")
    assert err.value.field == "reason"


def test_settings_dashboard_defaults_and_validation():
    s = load([], environ={})
    assert (s.dashboard_port, s.dashboard_host) == (0, "127.0.0.1")
    for env in ({"DTQ_DASHBOARD_PORT": "70000"}, {"DTQ_DASHBOARD_PORT": "-1"},
                {"DTQ_DASHBOARD_PORT": "8080", "DTQ_DASHBOARD_HOST": " "}):
        with pytest.raises(SettingsError, match="DTQ_DASHBOARD"):
            load([], environ=env)


async def test_a_taken_port_is_a_clear_oserror():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        backend = Backend(redis=None, settings=load([], environ={}), broker=None,
                          rates=RateTracker(), sessions={})
        dashboard = Dashboard(backend, hub=None, host="127.0.0.1", port=port)
        with pytest.raises(OSError, match=f"dashboard cannot listen on 127.0.0.1:{port}"):
            await dashboard.start()
