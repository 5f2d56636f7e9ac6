"""The scheduler leader lock ``dtq:lock:scheduler``: take, refresh, release.

The lock's value is the holder's token (gateway id plus a random part, chosen by
:class:`~dtq_gateway.duties.leader.LeaderLock`, which also keeps the local validity
deadline). Taking it is ``SET NX PX``; refreshing and releasing are compare-and-set /
compare-and-delete scripts, so a replica never extends or deletes a lock that passed
to another one (all three may write while Redis's memory is full). Each function is
one round trip; Redis failures are raised as they
come (see :mod:`dtq_gateway.store.errors`).
"""

from __future__ import annotations

from dtq_gateway.store import keys
from dtq_gateway.store.client import Client
from dtq_gateway.store.scripts import Script

_TAKE = Script("lock_take", allow_oom=True)
_REFRESH = Script("lock_refresh", allow_oom=True)
_RELEASE = Script("lock_release", allow_oom=True)


async def take(redis: Client, token: str, ttl_ms: int) -> bool:
    """``SET dtq:lock:scheduler <token> NX PX <ttl_ms>`` (``lock_take.lua``, which may
    write while Redis's memory is full: a leader is needed to drain it).

    Returns:
        True when the lock was free and now holds ``token`` for ``ttl_ms`` ms.
    """
    return int(await _TAKE(redis, [keys.SCHEDULER_LOCK], _TAKE.argv(token, ttl_ms))) == 1


async def refresh(redis: Client, token: str, ttl_ms: int) -> bool:
    """PEXPIRE the lock to ``ttl_ms`` ms only while its value is ``token``
    (``lock_refresh.lua``).

    Returns:
        True when the lock held ``token`` and was extended; False when it is gone or
        held by another replica (then nothing was changed).
    """
    return int(await _REFRESH(redis, [keys.SCHEDULER_LOCK],
                              _REFRESH.argv(token, ttl_ms))) == 1


async def release(redis: Client, token: str) -> bool:
    """Delete the lock only while its value is ``token`` (``lock_release.lua``).

    Returns:
        True when the lock held ``token`` and was deleted.
    """
    return int(await _RELEASE(redis, [keys.SCHEDULER_LOCK], _RELEASE.argv(token))) == 1
