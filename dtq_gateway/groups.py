"""Consumer groups: created once per queue per process, recreated after NOGROUP.

Every band stream carries the group ``workers`` (keys.GROUP), created with
``XGROUP CREATE <stream> workers 0 MKSTREAM``. Starting at id 0 (not ``$``) means
entries added before the group existed (for example after a FLUSHALL, when an
XADD recreates a stream without its group) are still delivered.
"""

from __future__ import annotations

import logging
import time

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from dtq_gateway import keys

log = logging.getLogger(__name__)


class Groups:
    """Remembers which queues have their ten groups, so creation costs one round trip once."""

    def __init__(self) -> None:
        self._ready: set[str] = set()
        self._last_recreate_log = 0.0

    async def ensure(self, redis: Redis, queues: list[str] | set[str]) -> None:
        """Create the groups of every queue not yet known to have them (BUSYGROUP ignored)."""
        todo = [q for q in queues if q not in self._ready]
        if not todo:
            return
        pipe = redis.pipeline(transaction=False)
        for q in todo:
            for stream in keys.queue_streams_desc(q):
                pipe.xgroup_create(stream, keys.GROUP, id="0", mkstream=True)
        for reply in await pipe.execute(raise_on_error=False):
            if isinstance(reply, ResponseError) and "BUSYGROUP" not in str(reply):
                raise reply
            if isinstance(reply, Exception) and not isinstance(reply, ResponseError):
                raise reply
        self._ready.update(todo)

    def ready(self, queues: list[str]) -> bool:
        """True when every queue is known to have its groups (no round trip needed)."""
        return all(q in self._ready for q in queues)

    def forget(self, queues: list[str] | set[str]) -> None:
        """Forget queues whose streams answered NOGROUP (Redis restarted empty or flushed)."""
        now = time.monotonic()
        if now - self._last_recreate_log > 10:
            log.warning("consumer groups missing, recreating", extra={"queues": sorted(queues)})
            self._last_recreate_log = now
        self._ready.difference_update(queues)
