"""The gateway's Redis client for each ``DTQ_REDIS_MODE``, built in this one place.

- ``standalone``: one Redis (``DTQ_REDIS_URL``), a bounded blocking connection pool.
- ``cluster``: redis-py's :class:`redis.asyncio.cluster.RedisCluster`; ``DTQ_REDIS_URL``
  names any node, the client discovers the rest and follows MOVED/ASK redirections and
  failovers. Every dtq script touches the keys of one queue, which all share one hash
  slot (``docs/redis-layout.md``), so each script runs on one node.
- ``sentinel``: redis-py's :class:`redis.asyncio.sentinel.Sentinel`; ``DTQ_REDIS_URL``
  names one sentinel or a comma list (``redis://s1:26379,s2:26379,s3:26379``) and
  ``DTQ_REDIS_SENTINEL_MASTER`` the monitored service. The pool asks every sentinel
  for the primary before each new connection and, on a switch, drops every connection
  to the old primary at once (:mod:`dtq_gateway.store.primary_watch`, whose
  PrimaryWatch duty notices a switch without waiting for a new connection).

Credentials in the URL (``redis://user:password@host:port``) authenticate to the data
nodes (cluster nodes, or the Sentinel service's primary); sentinels are reached
without them unless ``DTQ_REDIS_SENTINEL_PASSWORD`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar, cast
from urllib.parse import unquote, urlsplit

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import ClusterPipeline, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import MaxConnectionsError

from dtq_gateway.store.primary_watch import FollowingSentinelPool

#: The gateway's Redis client, whichever the mode: the layers above the store hold one
#: and hand it to store functions, never calling it themselves.
Client = Redis | RedisCluster

T = TypeVar("T")

#: The values of DTQ_REDIS_MODE.
MODES = ("standalone", "cluster", "sentinel")
#: Connection timeouts shared by every mode (s). No dtq call blocks on the server side,
#: so a socket timeout of a few seconds only fires on a dead connection.
SOCKET_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 3.0
#: Longest wait for a free connection (s), standalone pool and cluster call slots alike.
POOL_WAIT_S = 5.0
#: Connections per node kept beyond the bounded calls in cluster mode: pub/sub
#: subscriptions hold one of the node's connections for as long as they last.
PUBSUB_CONNECTIONS = 8
#: Set while a BoundedRedisCluster call holds its slot (a nested call does not wait).
_IN_CALL: ContextVar[bool] = ContextVar("dtq_redis_in_call", default=False)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One host:port of a comma-separated URL, with the URL's credentials and db."""

    host: str
    port: int


def parse_hosts(url: str, default_port: int = 6379) -> tuple[list[Endpoint], dict[str, Any]]:
    """Split ``redis://[user:pass@]h1:p1,h2:p2[/db]`` (or a comma list of full URLs)
    into endpoints and connection kwargs (username, password, db, ssl).

    Raises:
        ValueError: no host, or a port that is not a number.
    """
    parts = [p.strip() for p in url.split(",") if p.strip()]
    if not parts:
        raise ValueError("no host in the Redis URL")
    first = urlsplit(parts[0])
    scheme = first.scheme or "redis"
    kwargs: dict[str, Any] = {}
    if first.username:
        kwargs["username"] = unquote(first.username)
    if first.password:
        kwargs["password"] = unquote(first.password)
    if first.path.strip("/").isdigit():
        kwargs["db"] = int(first.path.strip("/"))
    if scheme == "rediss":
        kwargs["ssl"] = True
    endpoints = []
    for i, part in enumerate(parts):
        if "://" not in part:
            part = f"{scheme}://{part}"
        netloc = urlsplit(part).netloc.rpartition("@")[2]
        if i == 0 and len(parts) > 1 and "/" in netloc:
            netloc = netloc.split("/", 1)[0]
        host, sep, port = netloc.rpartition(":")
        if not sep:
            host, port = netloc, str(default_port)
        if not host or not port.isdigit():
            raise ValueError(f"bad host:port {netloc!r} in the Redis URL")
        endpoints.append(Endpoint(host.strip("[]"), int(port)))
    return endpoints, kwargs


def make_client(mode: str, url: str, *, max_connections: int = 16,
                sentinel_master: str = "", sentinel_password: str = "") -> Any:
    """The async client for ``mode`` (see the module docstring).

    Args:
        mode: ``standalone`` | ``cluster`` | ``sentinel``.
        url: DTQ_REDIS_URL.
        max_connections: pool size (standalone, Sentinel: calls wait up to 5 s for a
            free connection); in cluster mode the most calls in flight at once (more
            wait), each node's pool holding as many plus PUBSUB_CONNECTIONS.
        sentinel_master: the Sentinel service name (sentinel mode only).
        sentinel_password: password of the sentinels themselves ("" = none).

    Returns:
        A :class:`redis.asyncio.Redis` (standalone, sentinel) or
        :class:`redis.asyncio.cluster.RedisCluster`; both speak the same commands.

    Raises:
        ValueError: unknown mode, a malformed URL, or sentinel mode without a master.
    """
    common: dict[str, Any] = {"socket_timeout": SOCKET_TIMEOUT_S,
                              "socket_connect_timeout": CONNECT_TIMEOUT_S}
    if mode == "standalone":
        # A connection idle for over a second is PINGed before use, so after a Redis
        # restart stale pooled connections are replaced instead of failing the next
        # (non-idempotent) command.
        pool = BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=POOL_WAIT_S, health_check_interval=1,
            retry_on_timeout=False, **common)
        return Redis(connection_pool=pool)
    if mode == "cluster":
        # No automatic retries: redis-py's cluster client would re-send a whole pipeline
        # after a connection error (closing every pooled connection of every node under
        # the other calls first), and a dtq script re-sent after its reply was lost runs
        # twice. dtq handles the error itself (UNAVAILABLE to the caller, backoff in the
        # duties); the next call re-reads the topology. MOVED/ASK are still followed.
        return BoundedRedisCluster.from_url(
            url.split(",")[0], calls=max_connections,
            max_connections=max_connections + PUBSUB_CONNECTIONS,
            require_full_coverage=True, retry=Retry(NoBackoff(), 0), **common)
    if mode == "sentinel":
        if not sentinel_master:
            raise ValueError("sentinel mode needs DTQ_REDIS_SENTINEL_MASTER")
        endpoints, kwargs = parse_hosts(url, default_port=26379)
        sentinel_kwargs: dict[str, Any] = dict(common)
        if sentinel_password:
            sentinel_kwargs["password"] = sentinel_password
        sentinel = Sentinel([(e.host, e.port) for e in endpoints],
                            sentinel_kwargs=sentinel_kwargs, **common, **kwargs)
        return sentinel.master_for(sentinel_master, redis_class=Redis,
                                   connection_pool_class=FollowingSentinelPool,
                                   max_connections=max_connections, health_check_interval=1)
    raise ValueError(f"unknown Redis mode {mode!r} (one of {', '.join(MODES)})")


class _BoundedPipeline(ClusterPipeline):
    """A cluster pipeline whose execute() waits for a slot of its client."""

    async def execute(self, raise_on_error: bool = True,
                      allow_redirections: bool = True) -> list[Any]:
        async with cast(BoundedRedisCluster, self.cluster_client).call_slot():
            return await super().execute(raise_on_error, allow_redirections)


class BoundedRedisCluster(RedisCluster):
    """redis-py's cluster client with at most ``calls`` commands or pipelines in flight.

    A node's pool never waits: when it is exhausted the cluster client fails the call
    at once (MaxConnectionsError). Standalone mode's pool makes callers wait instead;
    this does the same for a cluster: a call waits for one of ``calls`` slots, and each
    node's pool is sized so that every slot finds a connection on any node.
    """

    def __init__(self, *args: Any, calls: int = 16, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._calls = asyncio.Semaphore(calls)

    @contextlib.asynccontextmanager
    async def call_slot(self) -> AsyncIterator[None]:
        """Hold one call slot (a call made while holding one does not wait again).

        Raises:
            MaxConnectionsError: no slot came free within POOL_WAIT_S (a ConnectionError:
                UNAVAILABLE to a caller, like standalone mode's exhausted pool).
        """
        if _IN_CALL.get():
            yield
            return
        try:
            async with asyncio.timeout(POOL_WAIT_S):
                await self._calls.acquire()
        except TimeoutError:
            raise MaxConnectionsError(f"no free Redis call slot in {POOL_WAIT_S:g} s") from None
        token = _IN_CALL.set(True)
        try:
            yield
        finally:
            _IN_CALL.reset(token)
            self._calls.release()

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        async with self.call_slot():
            return await super().execute_command(*args, **kwargs)

    def pipeline(self, transaction: Any | None = None,
                 shard_hint: Any | None = None) -> ClusterPipeline:
        if shard_hint:
            return super().pipeline(transaction, shard_hint)  # raises, as redis-py does
        # redis-py's stubs leave ClusterPipeline abstract; it is complete at run time
        return _BoundedPipeline(self, transaction)  # type: ignore[abstract]


def is_cluster(client: Any) -> bool:
    """True for a cluster client (its commands route by key slot)."""
    return isinstance(client, RedisCluster)


async def scan_keys(client: Any, match: str, count: int = 1000,
                    type_: str | None = None) -> AsyncIterator[bytes]:
    """SCAN over the whole key space: every primary of a cluster, the one server
    otherwise. Keys may repeat (SCAN's guarantee), never go missing if they existed for
    the whole scan."""
    async for key in client.scan_iter(match=match, count=count, _type=type_):
        yield key


async def on_primaries(client: Any, call: Callable[..., Awaitable[T]]) -> list[T]:
    """``call()`` once on the one server (standalone, Sentinel), or
    ``call(target_nodes=node)`` once per primary of a cluster, concurrently.

    For server-wide reads (PING, INFO, CONFIG GET) whose answer differs per primary:
    a cluster client sends those to one node unless told otherwise. ``call`` is a
    client method (or a function passing ``target_nodes`` on to every command it
    sends), e.g. ``on_primaries(r, r.ping)`` or
    ``on_primaries(r, functools.partial(r.info, "memory"))``.

    Returns:
        One reply per server, in the cluster's node order.

    Raises:
        Whatever ``call`` raises on any primary (the first such error); the calls on
        the other primaries still run to their end.
    """
    if not is_cluster(client):
        return [await call()]
    await client.initialize()  # a no-op once the slots are known
    return list(await asyncio.gather(*(call(target_nodes=node)
                                       for node in client.get_primaries())))
