"""Redis failures as dtq sees them: which exceptions mean "Redis cannot serve now".

Only the store knows redis-py's exception classes; the layers above ask this module.
:func:`as_dtq_error` maps a Redis failure to the domain error the servicers turn into a
gRPC status (``dtq_gateway.rpc.grpc_errors``); :data:`OUTAGE_ERRORS` is what background
loops catch to back off while Redis is unreachable.
"""

from __future__ import annotations

import os

from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    ClusterError,
    MasterDownError,
    MaxConnectionsError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from dtq_gateway.errors import DtqError, RedisFull, Unavailable

#: Exceptions of an unreachable Redis (connection refused or reset, a socket timeout);
#: builtin ConnectionError and TimeoutError are OSError subclasses.
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (RedisConnectionError, RedisTimeoutError,
                                                  OSError)

#: Prefixes of Redis error replies that mean "Redis cannot serve now" (transient, not
#: the caller's doing): a script or command still running (BUSY), persistence failing
#: (MISCONF), a cluster slot moving or down, a replica not yet in sync.
_TRANSIENT_REPLIES = ("BUSY", "MISCONF", "TRYAGAIN", "CLUSTERDOWN", "MOVED", "ASK",
                      "MASTERDOWN", "LOADING", "NOREPLICAS", "READONLY", "UNBLOCKED")

#: redis-py's asyncio connection module, where a connection closed under a call fails.
_REDIS_CONNECTION = os.path.join("redis", "asyncio", "connection.py")

class ReplicasNotAcked(RedisConnectionError):
    """A write the primary applied that fewer than DTQ_REDIS_MIN_REPLICAS_ACK replicas
    confirmed within DTQ_REDIS_REPLICA_ACK_TIMEOUT_MS (Redis ``WAIT``), or whose WAIT
    failed. Its outcome is unknown to the caller, like a connection lost after the
    write: it may survive a failover or not. Maps to UNAVAILABLE (:func:`as_dtq_error`).

    Args:
        wanted: replicas asked for (1..16).
        got: replicas that confirmed (-1: the WAIT itself failed or went to a node that
            no longer owns the written key's slot).
        timeout_ms: how long WAIT waited (ms).
        reply: the write's own reply (what the primary did), for callers that keep
            local state in step with Redis before answering the error.
    """

    def __init__(self, wanted: int, got: int, timeout_ms: int, reply: object = None) -> None:
        self.wanted, self.got, self.timeout_ms, self.reply = wanted, got, timeout_ms, reply
        seen = f"{got}" if got >= 0 else "no"
        super().__init__(
            f"the write reached the Redis primary but {seen} of the {wanted} replica(s) "
            f"DTQ_REDIS_MIN_REPLICAS_ACK asks for confirmed it within {timeout_ms} ms: it "
            "may be lost in a failover; resend it (Enqueue with its idempotency key; Ack "
            "and Fail are idempotent)")


_UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError,
                BusyLoadingError, ReadOnlyError, MasterDownError, TryAgainError,
                ClusterError, MaxConnectionsError, AuthenticationError, NoPermissionError)


def reply_code(exc: BaseException) -> str:
    """First word of a Redis error reply (``BUSY``, ``OOM``...), also when redis-py
    wrapped it as "Command # n (...) of pipeline caused error: ..."."""
    message = str(exc)
    if "caused error: " in message:
        message = message.split("caused error: ", 1)[1].lstrip("('\"")
    return message.split(" ", 1)[0]


def _broken_connection(exc: BaseException) -> bool:
    """True for the errors redis-py's asyncio connections raise when another call closed
    the connection under them (a cluster node died and the client reset its pool):
    ``AttributeError: 'NoneType' object has no attribute 'writelines'`` or
    ``RuntimeError: unable to perform operation on <TCPTransport closed=True>``, raised
    in (or under) redis-py's connection module. A dead connection, not a bug in dtq."""
    if not isinstance(exc, (AttributeError, RuntimeError)):
        return False
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(_REDIS_CONNECTION):
            return True
        tb = tb.tb_next
    return False


#: The message of redis-py's BlockingConnectionPool when its wait for a free connection
#: timed out (a redis ConnectionError, but Redis itself may answer fine).
_POOL_WAIT_MESSAGE = "No connection available."


def is_pool_busy(exc: BaseException) -> bool:
    """True when ``exc`` says every connection of the gateway's own pool stayed in use
    for the whole wait (POOL_WAIT_S): the gateway is busy, not Redis down.
    BlockingConnectionPool raises a plain ConnectionError with this message; the cluster
    client's slot wait raises MaxConnectionsError."""
    return isinstance(exc, MaxConnectionsError) or (
        isinstance(exc, RedisConnectionError) and str(exc) == _POOL_WAIT_MESSAGE)


def as_dtq_error(exc: BaseException) -> DtqError | None:
    """The domain error for a Redis failure, or None when ``exc`` is not one.

    Redis at ``maxmemory`` (an OOM reply) → :class:`RedisFull` (RESOURCE_EXHAUSTED);
    fewer replicas than DTQ_REDIS_MIN_REPLICAS_ACK confirmed a write
    (:class:`ReplicasNotAcked`, its message), Redis unreachable, loading, read-only (a replica after a failover), without a
    primary, busy with a script, failing to persist (MISCONF), refusing dtq's own
    credentials, a cluster slot moving, or a connection closed under the call (see
    ``_broken_connection``) → :class:`Unavailable` (UNAVAILABLE, reason
    REDIS_UNAVAILABLE); this gateway's connection pool busy for the whole wait
    (:func:`is_pool_busy`) → UNAVAILABLE with reason GATEWAY_BUSY (Redis is not down).
    All carry a 1000 ms retry hint.
    """
    if isinstance(exc, OutOfMemoryError) or (
            isinstance(exc, ResponseError) and reply_code(exc) == "OOM"):
        return RedisFull("Redis is out of memory (maxmemory reached): the request was not "
                         "stored; retry later", retry_after_ms=1000)
    if is_pool_busy(exc):
        return Unavailable("gateway busy: no free Redis connection of this gateway's pool "
                           "(DTQ_REDIS_MAX_CONNECTIONS) within 5 s; retry",
                           reason="GATEWAY_BUSY", retry_after_ms=1000)
    if isinstance(exc, ReplicasNotAcked):
        return Unavailable(str(exc), retry_after_ms=1000)
    if isinstance(exc, _UNAVAILABLE) or (
            isinstance(exc, ResponseError) and reply_code(exc) in _TRANSIENT_REPLIES) or (
            _broken_connection(exc)):
        return Unavailable(f"redis unavailable: {exc.__class__.__name__}", retry_after_ms=1000)
    return None


def is_redis_outage(exc: BaseException) -> bool:
    """True when ``exc`` says Redis cannot serve right now (unreachable, loading, busy
    with a script, read-only, failing to persist, a cluster slot moving, out of
    memory), also as the domain error it maps to: transient, to be retried, never a bug
    to log at ERROR."""
    mapped = exc if isinstance(exc, DtqError) else as_dtq_error(exc)
    return isinstance(mapped, (Unavailable, RedisFull))
