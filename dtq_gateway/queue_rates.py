"""Throughput of a queue from its outcome counters (``dtq:queue:<q>:counters``).

The counters are cumulative and shared by every replica (ack.lua and fail.lua
HINCRBY them). A rate needs two readings: each replica remembers the readings it
made (GetQueueStats, the metrics refresh) for a minute and answers the rate between
the newest reading and the oldest one still remembered that is at least
``MIN_WINDOW_MS`` older.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

#: Readings are kept this long (ms); the rate's window is at most about this.
KEEP_MS = 60_000
#: Shortest window a rate is computed over (ms).
MIN_WINDOW_MS = 1_000
#: Most queues remembered (least recently read dropped first).
MAX_QUEUES = 2_000


@dataclass(frozen=True, slots=True)
class Rate:
    """Per-second rates over ``window_ms`` (0 = no earlier reading yet)."""

    succeeded_per_s: float = 0.0
    failed_per_s: float = 0.0
    window_ms: int = 0


class QueueRates:
    """Readings ``(now_ms, succeeded, failed)`` per queue, bounded in time and count."""

    def __init__(self) -> None:
        self._readings: OrderedDict[str, deque[tuple[int, int, int]]] = OrderedDict()

    def observe(self, queue: str, now_ms: int, succeeded: int, failed: int) -> Rate:
        """Record a reading of the counters (``now_ms`` from Redis TIME) and return the
        rate since the oldest remembered reading at least ``MIN_WINDOW_MS`` older."""
        readings = self._readings.pop(queue, None) or deque()
        self._readings[queue] = readings
        while len(self._readings) > MAX_QUEUES:
            self._readings.popitem(last=False)
        while readings and (now_ms - readings[0][0] > KEEP_MS or readings[0][0] > now_ms):
            readings.popleft()
        rate = Rate()
        if readings and now_ms - readings[0][0] >= MIN_WINDOW_MS:
            t0, s0, f0 = readings[0]
            window = now_ms - t0
            rate = Rate(max(0, succeeded - s0) * 1000.0 / window,
                        max(0, failed - f0) * 1000.0 / window, window)
        if not readings or now_ms - readings[-1][0] >= MIN_WINDOW_MS // 2:
            readings.append((now_ms, succeeded, failed))
        return rate


#: The process's readings (one gateway per process).
RATES = QueueRates()
