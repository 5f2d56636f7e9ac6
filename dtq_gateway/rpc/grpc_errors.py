"""Translate domain errors into gRPC statuses, in one place.

Every status carries ``google.rpc.ErrorInfo`` (domain ``dtq.v1``, the error's
reason, and ``field`` in metadata when set) and, on UNAVAILABLE and
RESOURCE_EXHAUSTED, ``google.rpc.RetryInfo``. Unknown exceptions are logged with
a traceback and become INTERNAL without leaking details.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from dtq_gateway.errors import DtqError
from dtq_gateway.store.errors import as_dtq_error, is_redis_outage
from dtq_proto import dtq_pb2

log = logging.getLogger(__name__)
DOMAIN = "dtq.v1"


def to_dtq_error_quiet(exc: BaseException) -> DtqError | None:
    """:func:`to_dtq_error` without logging; None where it would be INTERNAL."""
    if isinstance(exc, DtqError):
        return exc
    return as_dtq_error(exc)


def to_dtq_error(exc: BaseException) -> DtqError:
    """Map any exception to a DtqError.

    Redis unreachable, loading, read-only (a replica after a failover), without a
    primary, busy with a script, failing to persist (MISCONF), refusing dtq's own
    credentials, a cluster slot moving, or the connection pool exhausted →
    UNAVAILABLE (REDIS_UNAVAILABLE, with RetryInfo); Redis at ``maxmemory`` →
    RESOURCE_EXHAUSTED (REDIS_OUT_OF_MEMORY); anything else (a bug in dtq, never a
    client's input) → INTERNAL, logged with its traceback.
    """
    mapped = to_dtq_error_quiet(exc)
    if mapped is not None:
        return mapped
    log.exception("internal error", exc_info=exc)
    return DtqError("internal error")


def status_of(err: DtqError) -> status_pb2.Status:
    """google.rpc.Status with ErrorInfo (and RetryInfo where a retry makes sense)."""
    info = error_details_pb2.ErrorInfo(reason=err.reason, domain=DOMAIN)
    if err.field:
        info.metadata["field"] = err.field
    details = [info]
    if err.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED):
        delay = duration_pb2.Duration()
        delay.FromMilliseconds(err.retry_after_ms or 1000)
        details.append(error_details_pb2.RetryInfo(retry_delay=delay))
    packed = []
    for d in details:
        a = any_pb2.Any()
        a.Pack(d)
        packed.append(a)
    return status_pb2.Status(code=err.code.value[0], message=err.message, details=packed)


def item_error(exc: BaseException) -> dtq_pb2.ItemError:
    """Per-item error message of a batched call."""
    err = to_dtq_error(exc)
    return dtq_pb2.ItemError(code=err.code.value[0], reason=err.reason, message=err.message,
                             field=err.field)


async def abort(context: grpc.aio.ServicerContext, exc: BaseException) -> NoReturn:
    """Abort the call with the status of ``exc`` (never returns)."""
    err = to_dtq_error(exc)
    await context.abort_with_status(rpc_status.to_status(status_of(err)))
    raise AssertionError("unreachable")  # abort_with_status raises


__all__ = ["abort", "code_pb2", "is_redis_outage", "item_error", "status_of", "to_dtq_error"]


R = TypeVar("R")


def mapped_errors(fn: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
    """Decorate a servicer's unary handler ``(self, request, context)`` so that any
    exception it raises ends the call with its gRPC status (:func:`abort`: a DtqError
    as its code and reason, a Redis outage UNAVAILABLE, anything else INTERNAL)."""

    @functools.wraps(fn)
    async def handler(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            return await fn(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to a status by abort()
            await abort(context, exc)

    return handler
