"""``dtq.v1.Events``: Subscribe streams lifecycle events from the gateway's hub.

Thin: validate the filters, take a subscription from the shared
:class:`~dtq_gateway.events.events_hub.EventsHub`, write what it buffered. The hub encodes
each event once for every subscriber (:func:`encode_event`: event dict → serialized
``SubscribeResponse``), so the stream writes pre-serialized bytes: the service is
registered by :func:`add_to_server` with an identity response serializer (same
method path, same proto; reflection and health are unaffected). The per-subscriber
``dropped`` count is appended to those bytes as one more encoded field (protobuf
merges concatenated encodings, and the base encoding never sets ``dropped``).

Over ``DTQ_EVENTS_MAX_SUBSCRIBERS`` open streams, Subscribe answers RESOURCE_EXHAUSTED
(reason TOO_MANY_SUBSCRIBERS). When the hub stops (gateway draining) the stream ends
with UNAVAILABLE so clients reconnect to another replica.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from dtq_gateway.errors import InvalidArgument, SubscriberLimit, Unavailable
from dtq_gateway.events.events_hub import Event, EventsHub
from dtq_gateway.logconf import RateLimitedLog
from dtq_gateway.rpc.grpc_errors import abort
from dtq_gateway.store import keys
from dtq_gateway.store.task_record import stringify
from dtq_proto import dtq_pb2, dtq_pb2_grpc

log = logging.getLogger(__name__)

_PREFIX = "EVENT_TYPE_"
MAX_FILTER_QUEUES = 256
SERVICE = "dtq.v1.Events"
#: Tag of SubscribeResponse.dropped (field 10, varint wire type).
_DROPPED_TAG = bytes([10 << 3])


def type_name(value: int) -> str:
    """EventType enum value → event JSON type string (``TASK_QUEUED``)."""
    return dtq_pb2.EventType.Name(value)[len(_PREFIX):]


def to_response(event: Event, dropped: int) -> dtq_pb2.SubscribeResponse | None:
    """Event JSON → SubscribeResponse; None for an unknown event type."""
    try:
        etype = dtq_pb2.EventType.Value(_PREFIX + str(event.get("type", "")))
    except ValueError:
        return None
    if etype == dtq_pb2.EVENT_TYPE_UNSPECIFIED:
        return None
    try:
        attempt = max(0, int(event.get("attempt") or 0))
    except (TypeError, ValueError):
        attempt = 0
    meta = event.get("metadata")
    return dtq_pb2.SubscribeResponse(
        event_id=str(event.get("event_id", "")), ts=str(event.get("ts", "")), type=etype,
        task_id=str(event.get("task_id") or ""), queue=str(event.get("queue") or ""),
        task_type=str(event.get("task_type") or ""), attempt=attempt,
        worker_id=str(event.get("worker_id") or ""),
        metadata={str(k): stringify(v) for k, v in meta.items()}
        if isinstance(meta, dict) else {},
        dropped=dropped)


def encode_event(event: Event) -> bytes | None:
    """Event dict → serialized ``SubscribeResponse`` without ``dropped``; None for an
    unknown event type. Called once per event for all subscribers."""
    response = to_response(event, 0)
    return None if response is None else response.SerializeToString()


#: Event type strings :func:`encode_event` can represent (the hub delivers only these).
EVENT_TYPES = frozenset(type_name(v) for v in dtq_pb2.EventType.values()
                        if v != dtq_pb2.EVENT_TYPE_UNSPECIFIED)


def hub_options() -> dict[str, Any]:
    """Keyword arguments that make an :class:`EventsHub` encode for this servicer."""
    return {"encode": encode_event, "event_types": EVENT_TYPES}


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def with_dropped(encoded: bytes, dropped: int) -> bytes:
    """``encoded`` (a SubscribeResponse without ``dropped``) with ``dropped`` set."""
    return encoded + _DROPPED_TAG + _varint(dropped) if dropped else encoded


def _filters(request: dtq_pb2.SubscribeRequest) -> tuple[list[str], list[str]]:
    if len(request.queues) > MAX_FILTER_QUEUES:
        raise InvalidArgument(f"queues: at most {MAX_FILTER_QUEUES}", field="queues")
    for q in request.queues:
        if not keys.QUEUE_RE.match(q):
            raise InvalidArgument("queues: queue name must match [A-Za-z0-9_.-]{1,64}",
                                  field="queues")
    types: list[str] = []
    for value in request.types:
        if value not in dtq_pb2.EventType.values():
            raise InvalidArgument(f"types: unknown event type {value}", field="types")
        if value == dtq_pb2.EVENT_TYPE_UNSPECIFIED:
            return list(request.queues), []  # UNSPECIFIED matches every type
        types.append(type_name(value))
    return list(request.queues), types


class EventsServicer(dtq_pb2_grpc.EventsServicer):
    """Implements dtq.v1.Events on top of the replica's :class:`EventsHub`.

    Register it with :func:`add_to_server`. The hub must encode with
    :func:`encode_event` (see :func:`hub_options`).

    Args:
        hub: the gateway's shared hub (started by the gateway).

    Raises:
        ValueError: the hub does not encode with :func:`encode_event`.
    """

    def __init__(self, hub: EventsHub) -> None:
        if hub.fanout.encode is not encode_event:
            raise ValueError("EventsServicer needs an EventsHub built with hub_options()")
        self.hub = hub
        self._refused_log = RateLimitedLog(log, every_s=60.0)

    async def Subscribe(self, request: dtq_pb2.SubscribeRequest,
                        context: grpc.aio.ServicerContext
                        ) -> AsyncIterator[bytes]:
        """Stream matching events (serialized ``SubscribeResponse``) until the client
        leaves or the gateway drains.

        The response headers (empty initial metadata) are sent as soon as the
        subscription is registered, before any event: every event published after a
        client has seen them reaches it (or is counted in ``dropped``)."""
        try:
            queues, types = _filters(request)
        except InvalidArgument as exc:
            await abort(context, exc)
        try:
            sub = self.hub.subscribe(queues, types)
        except SubscriberLimit as exc:
            self._refused_log.log(logging.WARNING, "events: subscriber refused at the "
                                  "limit of %d (DTQ_EVENTS_MAX_SUBSCRIBERS)",
                                  self.hub.fanout.max_subscribers, peer=context.peer())
            await abort(context, exc)
        try:
            # the response headers say "subscribed": a client may wait for them
            # (dtq tail prints its banner then), so no event after them is missed
            await context.send_initial_metadata(())
            while True:
                batch = await sub.get_batch()  # one wake-up per batch, not per event
                if batch is None:
                    await abort(context, Unavailable("gateway is draining; resubscribe",
                                                     reason="DRAINING"))
                for encoded, dropped in batch:
                    yield with_dropped(encoded, dropped)
        finally:
            self.hub.unsubscribe(sub)


def _identity(data: bytes) -> bytes:
    return data


def add_to_server(servicer: EventsServicer, server: grpc.aio.Server) -> None:
    """Register ``dtq.v1.Events`` so that Subscribe writes the pre-serialized
    ``SubscribeResponse`` bytes the hub buffered (the generated
    ``add_EventsServicer_to_server`` would serialize a message per subscriber)."""
    handlers = {"Subscribe": grpc.unary_stream_rpc_method_handler(
        servicer.Subscribe, request_deserializer=dtq_pb2.SubscribeRequest.FromString,
        response_serializer=_identity)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)
