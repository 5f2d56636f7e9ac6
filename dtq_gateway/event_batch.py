"""Lifecycle events as the Lua scripts publish them: one message per script call.

A script queues its events and publishes them once (``flush_events`` in
``lua/_lib.lua``) on ``keys.EVENTS_CHANNEL``::

    {"ts_ms": 1764526800123, "id_prefix": "<24 hex>",
     "events": [[type, task_id, queue, task_type, attempt, worker_id, metadata|null], ...]}

:func:`expand` turns such a message into the per-event dicts that the events hub,
the dispatcher and ``Events.Subscribe`` work with (the seed's event shape)::

    {"event_id": id_prefix + "%08x" % position (1-based), "ts": ISO 8601 UTC with ms,
     "type", "task_id", "queue", "task_type", "attempt", "worker_id", "metadata"?}

A message that is already one event object (the shape published before batching)
expands to itself, so a mixed-version deployment keeps working during an upgrade.
"""

from __future__ import annotations

import json
import time
from typing import Any

Event = dict[str, Any]


def iso_ms(ms: int) -> str:
    """Epoch milliseconds → ``YYYY-MM-DDTHH:MM:SS.mmmZ`` (UTC)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def expand(message: bytes | str | Any) -> list[Event]:
    """The events of one channel message, in order.

    Args:
        message: the raw message (JSON bytes or str) or its already decoded value.

    Returns:
        One dict per event; an empty list for a message that is neither a batch nor
        an event object.

    Raises:
        ValueError: the message is not JSON.
    """
    value = json.loads(message) if isinstance(message, (bytes, str)) else message
    if not isinstance(value, dict):
        return []
    batch = value.get("events")
    if not isinstance(batch, list):
        return [value] if "type" in value else []
    prefix = str(value.get("id_prefix", ""))
    try:
        ts = iso_ms(int(value.get("ts_ms") or 0))
    except (TypeError, ValueError, OverflowError):
        ts = ""
    out: list[Event] = []
    for position, item in enumerate(batch, start=1):
        if not isinstance(item, list) or len(item) < 6:
            continue
        event: Event = {"event_id": f"{prefix}{position:08x}", "ts": ts, "type": item[0],
                        "task_id": item[1], "queue": item[2], "task_type": item[3],
                        "attempt": item[4], "worker_id": item[5]}
        if len(item) > 6 and isinstance(item[6], dict):
            event["metadata"] = item[6]
        out.append(event)
    return out
