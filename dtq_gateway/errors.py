"""Domain errors. Each carries a gRPC status code and a stable UPPER_SNAKE reason.

The servicers translate them in one place (``dtq_gateway.rpc.grpc_errors``) into a
gRPC status with ``google.rpc.ErrorInfo`` details (domain ``dtq.v1``). Code below
the servicer raises these and never imports grpc status helpers itself.
"""

from __future__ import annotations

import grpc


class DtqError(Exception):
    """Base of every error the gateway reports to a caller."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    reason: str = "INTERNAL"

    def __init__(self, message: str, *, field: str = "", reason: str | None = None,
                 retry_after_ms: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if reason:
            self.reason = reason
        self.retry_after_ms = retry_after_ms


class InvalidArgument(DtqError):
    """Bad input; ``field`` names the offending request field."""

    code = grpc.StatusCode.INVALID_ARGUMENT
    reason = "INVALID_FIELD"


class NotFound(DtqError):
    """Unknown task, queue or dead-letter entry."""

    code = grpc.StatusCode.NOT_FOUND
    reason = "NOT_FOUND"


class AlreadyExists(DtqError):
    """The object to create exists already (a schedule of that name)."""

    code = grpc.StatusCode.ALREADY_EXISTS
    reason = "ALREADY_EXISTS"


class StaleLease(DtqError):
    """The lease is no longer the task's current one (reclaimed or finished)."""

    code = grpc.StatusCode.FAILED_PRECONDITION
    reason = "STALE_LEASE"


class WrongState(DtqError):
    """The task is in a state that does not allow the operation."""

    code = grpc.StatusCode.FAILED_PRECONDITION
    reason = "WRONG_STATE"


class QueueFull(DtqError):
    """The queue's depth gate (DTQ_MAX_QUEUE_DEPTH) is reached."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "QUEUE_FULL"


class QueueLimit(DtqError):
    """A new queue name while the registry holds DTQ_MAX_QUEUES names."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "TOO_MANY_QUEUES"


class ScheduleLimit(DtqError):
    """A new schedule while DTQ_MAX_SCHEDULES schedules exist."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "TOO_MANY_SCHEDULES"


class RateLimitLimit(DtqError):
    """A new rate limit while DTQ_MAX_RATE_LIMITS limits exist."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "TOO_MANY_RATE_LIMITS"


class TooLarge(DtqError):
    """A payload or request exceeds a size limit."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "TOO_LARGE"


class SubscriberLimit(DtqError):
    """The gateway's cap on open Events.Subscribe streams (DTQ_EVENTS_MAX_SUBSCRIBERS)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "TOO_MANY_SUBSCRIBERS"


class Unavailable(DtqError):
    """Redis is unreachable, or the gateway is draining."""

    code = grpc.StatusCode.UNAVAILABLE
    reason = "REDIS_UNAVAILABLE"


class RedisFull(DtqError):
    """Redis reached ``maxmemory`` under ``noeviction`` and refused the write; nothing was
    written by the refused call (a script is refused at its first write)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "REDIS_OUT_OF_MEMORY"


class Unauthenticated(DtqError):
    """No or unknown bearer token."""

    code = grpc.StatusCode.UNAUTHENTICATED
    reason = "UNAUTHENTICATED"


class PermissionDenied(DtqError):
    """The caller's role does not allow the method."""

    code = grpc.StatusCode.PERMISSION_DENIED
    reason = "PERMISSION_DENIED"
