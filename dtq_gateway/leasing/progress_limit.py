"""The server's bound on progress reports: a token bucket per lease, in memory.

docs/protocol.md §16.1 asks a worker for at most one early progress heartbeat per
second, plus whatever its regular heartbeat carries. A worker that ignores that (a bug,
or a hostile token sending thousands of reports per heartbeat) would otherwise make the
gateway write a task record and publish an event for every report. This bucket lets
:data:`RATE_PER_S` reports per lease per second through (at most :data:`BURST` at once);
the rest are dropped before they reach Redis and counted in
``dtq_progress_reports_dropped_total{reason}``. The lease extension of a heartbeat is
never affected, only its reports.

The bound is per gateway replica (nothing is shared through Redis, so it costs no
round trip): a worker spread over N replicas gets N times the rate, still bounded.
Memory is bounded too: a bucket idle for :data:`IDLE_S` is full again and is dropped,
and at most :data:`MAX_LEASES` buckets are kept (the oldest go first).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

#: Reports applied per lease per second, long-run.
RATE_PER_S = 2.0
#: Reports applied per lease at once after a quiet spell.
BURST = 2.0
#: A bucket untouched this long (s) is full again and forgotten.
IDLE_S = BURST / RATE_PER_S
#: Most leases tracked at once per gateway (about 100 bytes each).
MAX_LEASES = 200_000


class ProgressLimiter:
    """Decides, per lease id, whether a progress report is applied or dropped.

    Args:
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        #: lease id -> (tokens, monotonic s of the last update), least recently used first
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def allow(self, lease_id: str) -> bool:
        """Take one token of ``lease_id``'s bucket; False (report to drop) when empty."""
        now = self._clock()
        self._forget_idle(now)
        tokens, at = self._buckets.pop(lease_id, (BURST, now))
        tokens = min(BURST, tokens + (now - at) * RATE_PER_S)
        allowed = tokens >= 1.0
        self._buckets[lease_id] = (tokens - 1.0 if allowed else tokens, now)
        while len(self._buckets) > MAX_LEASES:
            self._buckets.popitem(last=False)
        return allowed

    def _forget_idle(self, now: float) -> None:
        """Drop buckets idle for IDLE_S or more (full again, so forgetting changes nothing)."""
        while self._buckets:
            lease_id, (_, at) = next(iter(self._buckets.items()))
            if now - at < IDLE_S:
                return
            del self._buckets[lease_id]
