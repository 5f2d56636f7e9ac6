"""Per-queue throughput for the web dashboard, counted from the events channel.

Every gateway replica hears every lifecycle event (the Lua scripts publish them on one
pub/sub channel, :mod:`dtq_gateway.events.events_hub`), so counting them here gives the
cluster-wide rate of one queue whichever replica serves the dashboard, with no Redis
call and no new key. :class:`RateTracker` is a hub listener: it keeps, per queue, the
counts of the last :data:`WINDOW_S` seconds in one-second buckets.

Cost: it exists only while the dashboard is on (``DTQ_DASHBOARD_PORT``); then every
event message with an outcome is decoded on this replica (a few microseconds per
message). Memory is bounded: at most ``max_queues`` queues are tracked, the one idle
longest is forgotten first. Rates start at zero when the gateway starts (the window
fills over its first minute).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Seconds of history kept per queue.
WINDOW_S = 60
#: Event type → counter index.
COUNTED = {"TASK_QUEUED": 0, "TASK_SUCCEEDED": 1, "TASK_FAILED": 2, "TASK_DEAD_LETTERED": 3}
_NAMES = ("enqueued", "succeeded", "failed", "dead_lettered")
_RAW_MARKS = tuple(t.encode() for t in COUNTED)


@dataclass(frozen=True, slots=True)
class Rates:
    """Events of one queue over the last ``window_s`` seconds, and per minute."""

    window_s: int
    enqueued: int = 0
    succeeded: int = 0
    failed: int = 0
    dead_lettered: int = 0

    def as_dict(self) -> dict[str, Any]:
        """JSON shape: counts in the window plus ``*_per_min`` rates."""
        out: dict[str, Any] = {"window_s": self.window_s}
        for name in _NAMES:
            count = getattr(self, name)
            out[name] = count
            out[f"{name}_per_min"] = round(count * 60 / self.window_s, 2)
        return out


class RateTracker:
    """Counts TASK_QUEUED / SUCCEEDED / FAILED / DEAD_LETTERED events per queue.

    Register with ``hub.add_listener(tracker.on_event, tracker.wants_raw)``.

    Args:
        window_s: history kept (s).
        max_queues: most queues tracked (the longest idle is dropped beyond it).
        clock: monotonic seconds (tests pass a fake).
    """

    def __init__(self, window_s: int = WINDOW_S, max_queues: int = 1000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.max_queues = max_queues
        self.clock = clock
        #: queue → {second: [enqueued, succeeded, failed, dead_lettered]}, LRU order
        self._queues: OrderedDict[str, dict[int, list[int]]] = OrderedDict()

    def wants_raw(self, raw: bytes) -> bool:
        """Cheap pre-filter on the raw channel message: any counted event type in it."""
        return any(mark in raw for mark in _RAW_MARKS)

    def on_event(self, event: dict[str, Any]) -> None:
        """Hub listener: count one event (others are ignored)."""
        index = COUNTED.get(event.get("type", ""))
        queue = event.get("queue")
        if index is None or not isinstance(queue, str) or not queue:
            return
        meta = event.get("metadata")
        if isinstance(meta, dict) and meta.get("reason") == "unparked":
            return  # a parked task back in its band (docs/fairness.md): not an enqueue
        self.count(queue, index)

    def count(self, queue: str, index: int, n: int = 1) -> None:
        """Add ``n`` to counter ``index`` (see :data:`COUNTED`) of ``queue`` now."""
        now = int(self.clock())
        buckets = self._queues.get(queue)
        if buckets is None:
            buckets = self._queues[queue] = {}
            if len(self._queues) > self.max_queues:
                self._queues.popitem(last=False)
        else:
            self._queues.move_to_end(queue)
        bucket = buckets.get(now)
        if bucket is None:
            for second in [s for s in buckets if s <= now - self.window_s]:
                del buckets[second]
            bucket = buckets[now] = [0, 0, 0, 0]
        bucket[index] += n

    def rates(self, queue: str) -> Rates:
        """Counts of ``queue`` over the last ``window_s`` seconds (zeros if unknown)."""
        buckets = self._queues.get(queue) or {}
        since = int(self.clock()) - self.window_s
        totals = [0, 0, 0, 0]
        for second, bucket in buckets.items():
            if second > since:
                for i, value in enumerate(bucket):
                    totals[i] += value
        return Rates(self.window_s, *totals)
