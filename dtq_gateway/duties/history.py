"""The history sampler: the scheduler leader's once-a-minute sample of every busy queue.

See :mod:`dtq_gateway.store.history` for what a sample holds and where it is kept.
"""

from __future__ import annotations

from dtq_gateway.duties.duty import PeriodicDuty
from dtq_gateway.duties.leader import LeaderLock
from dtq_gateway.settings import Settings
from dtq_gateway.store import admin, history
from dtq_gateway.store.client import Client


class HistorySampler(PeriodicDuty):
    """Every ``DTQ_HISTORY_INTERVAL_S`` the leader stores one sample of each busy queue
    (and of the queues it sampled last time, so the last outcomes of a queue that just
    drained are counted) and of all queues together.

    The window of a sample starts at the previous overall sample (whoever took it, so a
    new leader continues its predecessor's series), at most two intervals back.

    Args:
        redis: client.
        settings: ``history_interval_s`` and ``history_points``.
        lock: leadership (only the leader samples).
    """

    name = "history-sampler"

    def __init__(self, redis: Client, settings: Settings, lock: LeaderLock) -> None:
        super().__init__()
        self._redis = redis
        self._settings = settings
        self._lock = lock
        self._last: set[str] = set()

    def interval_s(self) -> float:
        """DTQ_HISTORY_INTERVAL_S."""
        return self._settings.history_interval_s

    def active(self) -> bool:
        """Only the scheduler leader samples."""
        return self._lock.is_leader

    async def tick(self) -> None:
        """Take one sample (a no-op when the previous one is less than half an interval
        old, e.g. just after a leader change)."""
        interval_ms = int(self._settings.history_interval_s * 1000)
        now = await admin.redis_now_ms(self._redis)
        last = await history.last_sample_ms(self._redis)
        if last and now - last < interval_ms // 2:
            return
        since = max(last, now - 2 * interval_ms) if last else now - interval_ms
        busy = await admin.busy_queues(self._redis)
        points = self._settings.history_points
        samples = await history.take_sample(self._redis, sorted(set(busy) | self._last),
                                            since, now, points, points * interval_ms)
        self._last = {q for q in samples if q} & set(busy)
