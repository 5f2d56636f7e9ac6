"""``dtq.v1.Events``: Subscribe streams lifecycle events from the gateway's hub.

Thin: validate the filters, take a subscription from the shared
:class:`~dtq_gateway.events_hub.EventsHub`, convert each event JSON (the seed's
shape: event_id, ts, type, task_id, queue, task_type, attempt, worker_id,
metadata?) into a ``SubscribeResponse``. When the hub stops (gateway draining)
the stream ends with UNAVAILABLE so clients reconnect to another replica.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc

from dtq_gateway import keys
from dtq_gateway.errors import InvalidArgument, Unavailable
from dtq_gateway.events_hub import Event, EventsHub
from dtq_gateway.grpc_errors import abort
from dtq_gateway.task_record import stringify
from dtq_proto import dtq_pb2, dtq_pb2_grpc

log = logging.getLogger(__name__)

_PREFIX = "EVENT_TYPE_"
MAX_FILTER_QUEUES = 256


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

    Args:
        hub: the gateway's shared hub (started by the gateway).
    """

    def __init__(self, hub: EventsHub) -> None:
        self.hub = hub

    async def Subscribe(self, request: dtq_pb2.SubscribeRequest,
                        context: grpc.aio.ServicerContext
                        ) -> AsyncIterator[dtq_pb2.SubscribeResponse]:
        """Stream matching events until the client leaves or the gateway drains."""
        try:
            queues, types = _filters(request)
        except InvalidArgument as exc:
            await abort(context, exc)
        sub = self.hub.subscribe(queues, types)
        carried = 0  # drops reported on events this stream cannot represent
        try:
            while True:
                item = await sub.get()
                if item is None:
                    await abort(context, Unavailable("gateway is draining; resubscribe",
                                                     reason="DRAINING"))
                event, dropped = item
                response = to_response(event, dropped + carried)
                if response is None:
                    carried += dropped
                    continue
                carried = 0
                yield response
        finally:
            self.hub.unsubscribe(sub)
