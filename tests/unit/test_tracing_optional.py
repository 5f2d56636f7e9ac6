"""Without OpenTelemetry (or without a configured SDK) tracing is a no-op."""

from __future__ import annotations

import pytest

from dtq_gateway import tracing
from dtq_proto import dtq_pb2
from dtq_pyworker import _tracing

TP = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"


@pytest.fixture(params=["no-package", "no-provider"])
def without_tracing(request, monkeypatch):
    if request.param == "no-package":
        monkeypatch.setattr(tracing, "_otel", None)
        monkeypatch.setattr(_tracing, "_otel", None)
    # else: the API may be installed, but no SDK tracer provider is configured


def test_spans_are_no_ops(without_tracing):
    assert not tracing.enabled() and not _tracing.enabled()
    with tracing.span("dtq.gateway.enqueue", TP):
        pass
    tracing.delivered({"traceparent": TP}, {})
    req = dtq_pb2.EnqueueRequest(queue="q", task_type="t")
    with _tracing.producer_span(req):
        pass
    assert req.traceparent == ""  # nothing injected: no span to continue
    with _tracing.handler_span(dtq_pb2.LeasedTask(traceparent=TP)) as span:
        _tracing.set_outcome(span, True)
    assert span is None
