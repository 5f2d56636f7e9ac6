"""Optional OpenTelemetry spans and W3C trace context of the gateway.

With the ``otel`` extra installed and a tracer provider configured
(``opentelemetry-sdk``, e.g. through ``opentelemetry-instrument`` and its OTEL_*
variables) the gateway records a SERVER span around Enqueue and
EnqueueBatch and a short span when a task is delivered to a worker, each a child of
the producer's ``traceparent``. Without the packages every function here is a no-op
and the trace context still travels: the task stores the producer's traceparent and
tracestate (metadata keys ``traceparent``/``tracestate``) and the worker receives them
in LeasedTask.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

log = logging.getLogger(__name__)

try:  # optional dependency: the `otel` extra
    from opentelemetry import trace as _otel
    from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - exercised where the extra is absent
    _otel = None  # type: ignore[assignment]

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_TRACER_NAME = "dtq_gateway"


def enabled() -> bool:
    """True when the OpenTelemetry API is importable and a tracer provider (an SDK) is
    configured. Without one every span would be a no-op: skipping them keeps the
    Enqueue and delivery paths free of the API's per-call cost."""
    return _otel is not None and not isinstance(
        _otel.get_tracer_provider(), ProxyTracerProvider | NoOpTracerProvider)


def call_trace(context: Any) -> tuple[str, str]:
    """(traceparent, tracestate) of a call's gRPC metadata ("" when absent)."""
    parent = state = ""
    for key, value in context.invocation_metadata() or ():
        if key == TRACEPARENT:
            parent = value.decode() if isinstance(value, bytes) else str(value)
        elif key == TRACESTATE:
            state = value.decode() if isinstance(value, bytes) else str(value)
    return parent, state


def _parent_context(traceparent: str, tracestate: str) -> Any:
    carrier = {TRACEPARENT: traceparent}
    if tracestate:
        carrier[TRACESTATE] = tracestate
    return TraceContextTextMapPropagator().extract(carrier) if traceparent else None


@contextlib.contextmanager
def span(name: str, traceparent: str = "", tracestate: str = "", kind: str = "SERVER",
         attributes: Mapping[str, Any] | None = None) -> Iterator[None]:
    """A span named ``name``, child of ``traceparent`` when given (no-op without OTel).

    Args:
        name: span name, e.g. "dtq.gateway.enqueue".
        traceparent: W3C traceparent of the parent, or "".
        tracestate: W3C tracestate of the parent, or "".
        kind: an ``opentelemetry.trace.SpanKind`` name.
        attributes: span attributes (str/int/float/bool values).
    """
    if not enabled():
        yield
        return
    tracer = _otel.get_tracer(_TRACER_NAME)
    with tracer.start_as_current_span(
            name, context=_parent_context(traceparent, tracestate),
            kind=getattr(_otel.SpanKind, kind), attributes=dict(attributes or {})):
        yield


def delivered(metadata: Mapping[str, str], attributes: Mapping[str, Any]) -> None:
    """Record the delivery of a task that carries a traceparent as a short span."""
    if TRACEPARENT not in metadata or not enabled():
        return
    try:
        with span("dtq.gateway.deliver", metadata[TRACEPARENT], metadata.get(TRACESTATE, ""),
                  "PRODUCER", attributes):
            pass
    except Exception:
        log.debug("delivery span failed", exc_info=True)
