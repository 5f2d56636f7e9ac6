"""The dashboard's live event feed: ``GET /api/events`` as Server-Sent Events.

One subscription of the gateway's :class:`~dtq_gateway.events.events_hub.EventsHub` per open
feed, exactly as ``Events.Subscribe`` takes one: the same filters, the same bounded
buffer, the same subscriber cap (``DTQ_EVENTS_MAX_SUBSCRIBERS``, over it: 429) and
delivery budget; a slow browser loses events and is told how many (``dropped``).

Wire format (``text/event-stream``): one ``data: <event JSON>`` line per event, an
empty line after each, and a ``: ping`` comment every :data:`PING_S` seconds of
silence. The page reads it with ``fetch`` (so it can send the token header, which
``EventSource`` cannot); ``curl -N`` works too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from aiohttp import web

from dtq_gateway.errors import InvalidArgument
from dtq_gateway.events.events_hub import EventsHub
from dtq_gateway.rpc.events_servicer import EVENT_TYPES, MAX_FILTER_QUEUES, type_name
from dtq_gateway.store import keys
from dtq_proto import dtq_pb2

#: Silence after which a comment line keeps the connection (and proxies) alive (s).
PING_S = 15.0


def filters(query: Any) -> tuple[list[str], list[str]]:
    """``queue`` and ``type`` query parameters (each repeatable, or comma-separated).

    Raises:
        InvalidArgument: a bad queue name or unknown event type (names the parameter).
    """
    queues = [q for raw in query.getall("queue", []) for q in raw.split(",") if q]
    types = [t for raw in query.getall("type", []) for t in raw.split(",") if t]
    if len(queues) > MAX_FILTER_QUEUES:
        raise InvalidArgument(f"queue: at most {MAX_FILTER_QUEUES}", field="queue")
    for q in queues:
        if not keys.QUEUE_RE.match(q):
            raise InvalidArgument("queue: queue name must match [A-Za-z0-9_.-]{1,64}",
                                  field="queue")
    for t in types:
        if t not in EVENT_TYPES:
            raise InvalidArgument(f"type: unknown event type (one of "
                                  f"{', '.join(sorted(EVENT_TYPES))})", field="type")
    return queues, types


def event_json(encoded: bytes, dropped: int) -> dict[str, Any]:
    """A hub-encoded event (serialized ``SubscribeResponse``) as the feed's JSON."""
    msg = dtq_pb2.SubscribeResponse.FromString(encoded)
    return {"event_id": msg.event_id, "ts": msg.ts, "type": type_name(msg.type),
            "task_id": msg.task_id, "queue": msg.queue, "task_type": msg.task_type,
            "attempt": msg.attempt, "worker_id": msg.worker_id,
            "metadata": dict(msg.metadata), "dropped": dropped}


async def event_stream(request: web.Request, hub: EventsHub,
                       stopping: asyncio.Event) -> web.StreamResponse:
    """Serve one feed until the client leaves, the hub closes or ``stopping`` is set.

    Raises:
        InvalidArgument: bad filters. SubscriberLimit: at the subscriber cap.
    """
    queues, types = filters(request.query)
    sub = hub.subscribe(queues, types)
    try:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-store",
                                               "X-Accel-Buffering": "no"})
        await response.prepare(request)
        await response.write(b": connected\n\n")
        stop = asyncio.ensure_future(stopping.wait())
        try:
            while True:
                get = asyncio.ensure_future(sub.get_batch())
                done, _ = await asyncio.wait({get, stop}, timeout=PING_S,
                                             return_when=asyncio.FIRST_COMPLETED)
                if get not in done:
                    get.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await get
                    if stop in done:
                        break
                    await response.write(b": ping\n\n")
                    continue
                batch = get.result()
                if batch is None:
                    break  # the hub closed (gateway draining)
                lines = [b"data: " + json.dumps(event_json(encoded, dropped),
                                                separators=(",", ":")).encode() + b"\n\n"
                         for encoded, dropped in batch]
                await response.write(b"".join(lines))
        except (ConnectionResetError, ConnectionError):
            pass  # the browser left
        finally:
            stop.cancel()
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
        return response
    finally:
        hub.unsubscribe(sub)
