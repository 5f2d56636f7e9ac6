"""Redis must never evict dtq's keys: the gateway watches ``maxmemory-policy``.

Under any policy but ``noeviction`` a Redis that reaches ``maxmemory`` deletes keys
to make room: accepted tasks vanish (GetTask NOT_FOUND), idempotency records and the
scheduler lock with them, and nobody is told. With ``noeviction`` Redis refuses the
write instead, and the caller gets UNAVAILABLE / an error it can see.

:class:`EvictionPolicyWatch` reads the policy at startup and then every
``DTQ_EVICTION_CHECK_INTERVAL_S``, with ``CONFIG GET`` or, where CONFIG is renamed
or not permitted (managed Redis services), from ``INFO memory``; in cluster mode on
every primary, since any of them may evict its part of the keys. It sets the
``dtq_redis_eviction_safe`` gauge (1 noeviction, 0 evicting, -1 unknown) and logs
each change once. With ``DTQ_REQUIRE_NOEVICTION`` (default true) an evicting policy
is refused: the gateway does not start, and a policy changed at run time turns
health NOT_SERVING and makes Enqueue answer FAILED_PRECONDITION
(``REDIS_EVICTION_POLICY``) until it is ``noeviction`` again. With the setting false
the gateway serves and only warns. An unknown policy (neither command answers) is
warned about and never refused.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import grpc
from redis.exceptions import ResponseError

from dtq_gateway.errors import DtqError
from dtq_gateway.metrics import REDIS_EVICTION_SAFE
from dtq_gateway.store.client import Client, on_primaries

log = logging.getLogger(__name__)

SAFE_POLICY = "noeviction"


class EvictionPolicyError(RuntimeError):
    """Redis may evict keys and DTQ_REQUIRE_NOEVICTION is on (the message says how to fix)."""


class EvictingRedis(DtqError):
    """Enqueue refused: Redis may evict accepted tasks (DTQ_REQUIRE_NOEVICTION)."""

    code = grpc.StatusCode.FAILED_PRECONDITION
    reason = "REDIS_EVICTION_POLICY"


async def read_policy(redis: Client) -> str | None:
    """Redis's maxmemory-policy, from CONFIG GET or else INFO memory.

    In cluster mode every primary is read (each holds part of the keys, and any of
    them may evict its part): the first policy other than ``noeviction`` found wins,
    else None when some primary refused both commands, else ``noeviction``.

    Returns:
        The policy name, or None when Redis refuses both commands.

    Raises:
        redis.exceptions.ConnectionError, TimeoutError: Redis (a primary) is unreachable.
    """
    policies = await on_primaries(redis, functools.partial(_read_node_policy, redis))
    evicting = [p for p in policies if p is not None and p != SAFE_POLICY]
    if evicting:
        return evicting[0]
    return None if None in policies else SAFE_POLICY


async def _read_node_policy(redis: Client, **target: Any) -> str | None:
    """One server's policy (``target``: the cluster node, see ``on_primaries``)."""
    try:
        value = (await redis.config_get("maxmemory-policy", **target)).get("maxmemory-policy")
        if value:
            return value.decode() if isinstance(value, bytes) else str(value)
    except ResponseError:  # CONFIG renamed or not permitted: INFO also has it
        pass
    try:
        value = (await redis.info("memory", **target)).get("maxmemory_policy")
    except ResponseError:
        return None
    if not value:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


class EvictionPolicyWatch:
    """Knows whether Redis may evict, refreshed every ``interval_s``.

    Args:
        redis: the gateway's client.
        require: refuse to serve under an evicting policy (DTQ_REQUIRE_NOEVICTION).
        interval_s: how often :meth:`maybe_check` reads the policy again (s).
    """

    def __init__(self, redis: Client, *, require: bool, interval_s: float) -> None:
        self.redis = redis
        self.require = require
        self.interval_s = interval_s
        self.policy: str | None = None
        self._checked_at = float("-inf")
        self._logged: str | None = "<never>"

    @property
    def evicting(self) -> bool:
        """True when the last known policy may evict keys."""
        return self.policy is not None and self.policy != SAFE_POLICY

    @property
    def refusing(self) -> bool:
        """True when the gateway must not serve (evicting and required)."""
        return self.require and self.evicting

    async def check(self, *, at_startup: bool = False) -> str | None:
        """Read the policy now, update the gauge and log a change once.

        Args:
            at_startup: the gateway's start reads it: a refused policy is not logged
                here, since the start fails with :meth:`startup_error`, whose one ERROR
                line says it (a line saying "NOT_SERVING until ..." would read as if the
                gateway kept running).
        """
        self._checked_at = time.monotonic()
        self.policy = await read_policy(self.redis)
        REDIS_EVICTION_SAFE.set(-1 if self.policy is None else 0 if self.evicting else 1)
        if self.policy != self._logged:
            self._logged = self.policy
            if not (at_startup and self.refusing):
                self._log()
        return self.policy

    async def maybe_check(self) -> None:
        """:meth:`check` when ``interval_s`` passed since the last one."""
        if time.monotonic() - self._checked_at >= self.interval_s:
            await self.check()

    def _log(self) -> None:
        if self.policy is None:
            log.warning("cannot read Redis maxmemory-policy (CONFIG GET and INFO refused); "
                        "make sure it is noeviction, or accepted tasks can be evicted")
        elif not self.evicting:
            log.info("redis maxmemory-policy is noeviction")
        elif self.require:
            log.error("redis maxmemory-policy is %s: Redis may evict accepted tasks; health "
                      "NOT_SERVING and Enqueue refused until it is noeviction "
                      "(DTQ_REQUIRE_NOEVICTION=false serves anyway)", self.policy,
                      extra={"policy": self.policy})
        else:
            log.warning("redis maxmemory-policy is %s: Redis may evict accepted tasks when "
                        "memory is full; set it to noeviction", self.policy,
                        extra={"policy": self.policy})

    def admit(self) -> None:
        """Raise :class:`EvictingRedis` while the gateway refuses to accept tasks."""
        if self.refusing:
            raise EvictingRedis(f"Redis maxmemory-policy is {self.policy}; accepted tasks "
                                "could be evicted. Set it to noeviction.")

    def startup_error(self) -> EvictionPolicyError | None:
        """The error that stops the gateway from starting, or None."""
        if not self.refusing:
            return None
        return EvictionPolicyError(
            f"Redis maxmemory-policy is {self.policy!r}: it may evict dtq's keys (accepted "
            "tasks, the scheduler lock). Run CONFIG SET maxmemory-policy noeviction (and "
            "persist it), or set DTQ_REQUIRE_NOEVICTION=false to serve with a warning")
