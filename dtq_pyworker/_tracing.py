"""Optional OpenTelemetry spans and W3C trace context of the worker and clients.

With ``opentelemetry-api`` installed (the ``otel`` extra) and a tracer provider
configured (``opentelemetry-sdk``, set up by the application) a client's enqueue runs in a
PRODUCER span "dtq.enqueue" whose context travels in EnqueueRequest.traceparent, and a
handler runs in a CONSUMER span "dtq.handle <task_type>", child of the task's
LeasedTask.traceparent. Without the package nothing is recorded and nothing is
injected: a caller may still set ``traceparent`` itself, and it travels all the same.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

try:  # optional dependency: the `otel` extra
    from opentelemetry import trace as _otel
    from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - exercised where the extra is absent
    _otel = None  # type: ignore[assignment]

_TRACER = "dtq_pyworker"


def enabled() -> bool:
    """True when the OpenTelemetry API is importable and a tracer provider (an SDK) is
    configured; without one every span would be a no-op, so none is started (a
    handler's per-task cost stays as without the package)."""
    return _otel is not None and not isinstance(
        _otel.get_tracer_provider(), ProxyTracerProvider | NoOpTracerProvider)


@contextlib.contextmanager
def producer_span(req: Any) -> Iterator[None]:
    """Run an enqueue in a PRODUCER span and put its context into ``req`` (an
    EnqueueRequest) unless the caller set ``req.traceparent`` already."""
    if req.traceparent or not enabled():
        yield
        return
    tracer = _otel.get_tracer(_TRACER)
    with tracer.start_as_current_span(
            "dtq.enqueue", kind=_otel.SpanKind.PRODUCER,
            attributes={"dtq.queue": req.queue, "dtq.task_type": req.task_type}):
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
        req.traceparent = carrier.get("traceparent", "")
        req.tracestate = carrier.get("tracestate", "")
        yield


@contextlib.contextmanager
def handler_span(task: Any) -> Iterator[Any]:
    """Run a handler in a CONSUMER span, child of the task's traceparent; yields the span
    (None without OpenTelemetry)."""
    if not enabled():
        yield None
        return
    parent = None
    if task.traceparent:
        carrier = {"traceparent": task.traceparent}
        if task.tracestate:
            carrier["tracestate"] = task.tracestate
        parent = TraceContextTextMapPropagator().extract(carrier)
    tracer = _otel.get_tracer(_TRACER)
    with tracer.start_as_current_span(
            f"dtq.handle {task.task_type}", context=parent, kind=_otel.SpanKind.CONSUMER,
            attributes={"dtq.task_id": task.task_id, "dtq.queue": task.queue,
                        "dtq.attempt": task.attempt}) as span:
        yield span


def set_outcome(span: Any, ok: bool, description: str = "") -> None:
    """Mark a handler span as succeeded or failed (no-op for None)."""
    if span is None:
        return
    span.set_status(Status(StatusCode.OK) if ok else Status(StatusCode.ERROR, description))
