"""The message format of the events channel (``keys.EVENTS_CHANNEL``), decoded.

Two formats arrive on the channel:

* **batch** (one PUBLISH per script call, whatever the number of events)::

      {"ts_ms": 1764526800123, "id_prefix": "<24 hex>", "events": [
         ["TASK_FAILED", task_id, queue, task_type, attempt, worker_id,
          {"error": "boom", "error_class": "ValueError"} or null], ...]}

  Event *i* (1-based) gets ``event_id = id_prefix + "%08x" % i`` and the shared ``ts``;
* **single** (one JSON object per event, the seed's shape), still published by
  scripts that have not moved to the batch format.

Either way the result is a list of the seed's event dicts: ``event_id``, ``ts``
(ISO 8601 UTC with milliseconds and ``Z``), ``type``, ``task_id``, ``queue``,
``task_type``, ``attempt`` (int), ``worker_id`` and ``metadata`` when present. The
rest of the gateway (listeners, ``Events.Subscribe``) only ever sees those dicts.
"""

from __future__ import annotations

import json
import time
from typing import Any

Event = dict[str, Any]

#: Fields of one batch element after its type, in order.
_FIELDS = ("task_id", "queue", "task_type", "attempt", "worker_id", "metadata")


def iso_ms(ms: int) -> str:
    """Epoch milliseconds → ``2026-11-30T18:20:00.123Z`` (the Lua ``iso()`` format).

    Raises:
        OverflowError, ValueError, OSError: ``ms`` is outside what ``time.gmtime``
            can represent.
    """
    seconds, milli = divmod(ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{milli:03d}Z"


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return "" if value is None else str(value)


def _attempt(value: Any) -> int:
    if isinstance(value, bool):
        return 0
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _element(prefix: str, index: int, ts: str, item: Any) -> Event | None:
    """Batch element ``index`` (1-based) → event dict; None when it is not a list
    starting with a type string (its position still counts for later event ids)."""
    if not isinstance(item, list) or not item or not isinstance(item[0], str):
        return None
    values = dict(zip(_FIELDS, item[1:]))
    event: Event = {"event_id": f"{prefix}{index:08x}", "ts": ts, "type": item[0],
                    "task_id": _text(values.get("task_id")),
                    "queue": _text(values.get("queue")),
                    "task_type": _text(values.get("task_type")),
                    "attempt": _attempt(values.get("attempt")),
                    "worker_id": _text(values.get("worker_id"))}
    metadata = values.get("metadata")
    if isinstance(metadata, dict):
        event["metadata"] = metadata
    return event


def expand_batch(message: dict[str, Any]) -> list[Event] | None:
    """The events of one batch message, in order; None when its header is malformed.

    Elements that are not events are skipped (counted by position all the same, so
    event ids never shift). An empty Lua table arrives as ``{}``: no events.
    """
    ts_ms, prefix, items = message.get("ts_ms"), message.get("id_prefix"), message["events"]
    if items == {}:
        items = []
    if not isinstance(ts_ms, (int, float)) or isinstance(ts_ms, bool) \
            or not isinstance(prefix, str) or not isinstance(items, list):
        return None
    try:
        ts = iso_ms(int(ts_ms))  # cjson may write a large integer as a float
    except (OverflowError, ValueError, OSError):
        return None
    events = []
    for index, item in enumerate(items, 1):
        event = _element(prefix, index, ts, item)
        if event is not None:
            events.append(event)
    return events


def decode(data: bytes | str) -> list[Event] | None:
    """One raw channel message → its events, in order; None when malformed.

    Args:
        data: the PUBLISHed payload (JSON, batch or single format).
    """
    try:
        message = json.loads(data)
    except ValueError:
        return None
    if not isinstance(message, dict):
        return None
    if "events" in message:
        return expand_batch(message)
    return [message]
