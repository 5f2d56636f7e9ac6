"""The Redis side of the gateway's health probe, its liveness key and shutdown.

:class:`dtq_gateway.health_probe.HealthProbe` decides health; these functions read what it
decides on. In cluster mode each read covers every primary (each holds part of the
keys): Redis answers only when all primaries answer, and memory is full when any
primary is at ``maxmemory``, since writes to its slots are then refused. The
maxmemory-policy watch is :mod:`dtq_gateway.store.redis_policy`.

The gateway liveness key ``dtq:gateway:<tag>`` (TTL ``DTQ_WORKER_TTL_MS``) tells
ListWorkers which gateways still hold their workers' Lease streams
(:func:`dtq_gateway.store.admin_lists.list_workers`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import cast

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import OutOfMemoryError

from dtq_gateway.store import keys, scripts
from dtq_gateway.store.client import Client, is_cluster, on_primaries


@dataclass(frozen=True, slots=True)
class Memory:
    """``used_memory`` and ``maxmemory`` of one server (INFO memory), in bytes."""

    used_bytes: int
    #: 0 = no limit
    max_bytes: int

    @property
    def full(self) -> bool:
        """At ``maxmemory``: every write is refused (noeviction) or evicts keys."""
        return self.max_bytes > 0 and self.used_bytes >= self.max_bytes


def liveness_key(gateway_id: str) -> str:
    """The liveness key of the gateway ``gateway_id`` (DTQ_GATEWAY_ID)."""
    return keys.gateway(keys.gateway_tag(gateway_id))


async def ping(redis: Client) -> None:
    """PING the server, or every primary of a cluster.

    Raises:
        Any Redis or OS error of an unreachable (or loading...) server or primary.
    """
    await on_primaries(redis, redis.ping)


async def drop_idle_connections(redis: Client) -> None:
    """Close the pooled connections no call holds (on every node of a cluster).

    Called when Redis answers again after an outage: a connection pooled before a
    restart is dead, and the first call to use it would fail with a ConnectionError
    (calls are never re-sent, see ``client.make_client``); closed, it reconnects on use.
    """
    if is_cluster(redis):
        for node in cast(RedisCluster, redis).get_nodes():
            await node.disconnect_free_connections()
    else:
        await cast(Redis, redis).connection_pool.disconnect(inuse_connections=False)


async def read_memory(redis: Client) -> Memory:
    """INFO memory of the server, or of every primary of a cluster: then the first full
    primary, else the one with the least room left (a limitless one has infinite room).

    Raises:
        Any Redis or OS error of the server or of a primary.
    """
    infos = await on_primaries(redis, functools.partial(redis.info, "memory"))
    found = [Memory(int(i.get("used_memory") or 0), int(i.get("maxmemory") or 0))
             for i in infos]
    return min(found, key=lambda m: (not m.full, m.max_bytes - m.used_bytes
                                     if m.max_bytes else float("inf")))


async def read_cpu_seconds(redis: Client) -> float:
    """CPU seconds Redis used since it started (INFO cpu ``used_cpu_sys`` +
    ``used_cpu_user``), summed over the primaries of a cluster.

    Raises:
        Any Redis or OS error of the server or of a primary.
    """
    infos = await on_primaries(redis, functools.partial(redis.info, "cpu"))
    return sum(float(i.get("used_cpu_sys") or 0) + float(i.get("used_cpu_user") or 0)
               for i in infos)


async def takes_script_flags(redis: Client) -> bool:
    """True when the server (every primary of a cluster) is Redis 7.0 or newer, which
    runs scripts with a ``#!lua flags=...`` shebang (INFO server ``redis_version``).

    Raises:
        Any Redis or OS error of the server or of a primary.
    """
    infos = await on_primaries(redis, functools.partial(redis.info, "server"))
    return all(int(str(i.get("redis_version") or "0").split(".")[0]) >= 7 for i in infos)


async def detect_script_flags(redis: Client) -> bool:
    """:func:`takes_script_flags`; on an older server (6.2) the ``allow_oom`` scripts are
    sent without their shebang from then on (:func:`scripts.note_no_script_flags`).

    Raises:
        Any Redis or OS error of the server or of a primary.
    """
    ok = await takes_script_flags(redis)
    if not ok:
        scripts.note_no_script_flags()
    return ok


def way_out_available() -> bool:
    """False once Redis refused script flags (6.2): a full Redis then refuses leasing,
    Ack and Fail as well (:func:`dtq_gateway.store.scripts.flags_supported`)."""
    return scripts.flags_supported()


async def refresh_liveness(redis: Client, key: str, ttl_ms: int) -> None:
    """SET the gateway liveness ``key`` to "1" with a TTL of ``ttl_ms`` (PX). While
    Redis is full (SET refused) PEXPIRE, which Redis still runs, keeps an existing key
    alive, so ListWorkers keeps counting this gateway's Lease streams.

    Raises:
        Any other Redis error.
    """
    try:
        await redis.set(key, "1", px=ttl_ms)
    except OutOfMemoryError:
        await redis.pexpire(key, ttl_ms)


async def delete_liveness(redis: Client, key: str) -> None:
    """DEL the gateway liveness ``key`` (a stopping gateway)."""
    await redis.delete(key)


async def close(redis: Client) -> None:
    """Close the client and its connections (the gateway's last Redis call)."""
    await redis.aclose()
