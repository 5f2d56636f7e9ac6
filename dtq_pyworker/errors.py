"""Errors of dtq_pyworker: handler outcomes and decoded gRPC failures.

Handlers raise :class:`Retry` or :class:`PermanentError` to steer what the
gateway does with a failed attempt. Calls to the gateway raise
:class:`DtqRpcError`, which carries the gRPC code and the stable
``google.rpc.ErrorInfo`` reason (and offending field) the gateway sends in the
``grpc-status-details-bin`` trailer.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

log = logging.getLogger(__name__)

_CODES_BY_VALUE = {c.value[0]: c for c in grpc.StatusCode}


class Retry(Exception):
    """Raised by a handler to retry the task after a fixed delay.

    The delay replaces the gateway's exponential backoff. The attempt still
    counts: with no attempts left the task is dead-lettered.

    Args:
        after_s: Delay before the retry in seconds (0 = the gateway's backoff).
        message: Optional error text stored with the attempt.
    """

    def __init__(self, after_s: float = 0.0, message: str = "") -> None:
        super().__init__(message or f"retry requested after {after_s}s")
        if after_s < 0:
            raise ValueError("after_s must be >= 0")
        self.after_s = float(after_s)


class PermanentError(Exception):
    """Raised by a handler for a failure that retrying cannot fix.

    The task is dead-lettered at once. Any exception with an attribute
    ``non_retryable = True`` is treated the same way.
    """

    non_retryable = True


class DtqRpcError(Exception):
    """A gRPC call to the gateway failed.

    Attributes:
        code: The ``grpc.StatusCode``.
        reason: Stable UPPER_SNAKE reason from ``google.rpc.ErrorInfo`` ("" if none).
        message: Human-readable status message.
        field: Offending request field for INVALID_ARGUMENT ("" if none).
        retry_after_s: Delay suggested by ``google.rpc.RetryInfo`` in seconds, or None.
    """

    def __init__(self, code: grpc.StatusCode, reason: str = "", message: str = "",
                 field: str = "", retry_after_s: float | None = None) -> None:
        super().__init__(f"{code.name} {reason or '-'}: {message}"
                         + (f" (field {field})" if field else ""))
        self.code = code
        self.reason = reason
        self.message = message
        self.field = field
        self.retry_after_s = retry_after_s

    @classmethod
    def from_rpc_error(cls, err: grpc.RpcError) -> DtqRpcError:
        """Decode a failed call (sync ``grpc.RpcError`` or ``grpc.aio.AioRpcError``).

        Args:
            err: The exception raised by the stub call.

        Returns:
            A DtqRpcError with the ErrorInfo reason and field when present.
        """
        code = _call(err, "code") or grpc.StatusCode.UNKNOWN
        message = _call(err, "details") or ""
        reason, field, retry_after_s = "", "", None
        try:
            status = rpc_status.from_call(err)
        except (ValueError, TypeError, AttributeError) as exc:  # malformed details
            log.debug("cannot decode status details: %s", exc)
            status = None
        if status is not None:
            for detail in status.details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
                    reason, field = info.reason, info.metadata.get("field", "")
                elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                    retry = error_details_pb2.RetryInfo()
                    detail.Unpack(retry)
                    retry_after_s = retry.retry_delay.ToMilliseconds() / 1000.0
        return cls(code, reason, message, field, retry_after_s)

    @classmethod
    def from_item_error(cls, item: Any) -> DtqRpcError:
        """Build from a per-item ``dtq_pb2.ItemError`` of a batched call.

        Args:
            item: The ItemError message.

        Returns:
            The equivalent DtqRpcError.
        """
        code = _CODES_BY_VALUE.get(item.code, grpc.StatusCode.UNKNOWN)
        return cls(code, item.reason, item.message, item.field)


def _call(err: Any, name: str) -> Any:
    method = getattr(err, name, None)
    if method is None:
        return None
    try:
        return method()
    except Exception:  # noqa: BLE001 - a broken call object must not hide the error
        return None
