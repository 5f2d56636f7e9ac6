"""Requests that fail to parse answer INVALID_ARGUMENT, on every RPC.

grpc calls a method's ``request_deserializer`` before any servicer code runs; an
exception there (a protobuf ``DecodeError``: invalid UTF-8 in a string field, a
truncated varint) ends the call with UNKNOWN, which workers treat as transient and
resend forever. :class:`DecodeGuardInterceptor` swaps every unary-request
handler's deserializer for one that never raises: it returns an
:class:`Undecodable` marker instead, and the handler's behavior answers the marker
with INVALID_ARGUMENT (reason ``MALFORMED_REQUEST``, field ``request``).

Because parsing no longer fails before the behavior runs, interceptors placed
before this one decide first: with auth on, a garbled request without a valid
token is answered UNAUTHENTICATED, never INVALID_ARGUMENT. Streaming-request
methods (only server reflection has one) keep grpc's own handling.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import grpc

from dtq_gateway.errors import InvalidArgument
from dtq_gateway.rpc import grpc_errors
from dtq_gateway.rpc.auth import WrappingInterceptor

#: Longest parser message quoted back to the caller (characters, ASCII in practice).
MAX_DETAIL_CHARS = 200


class Undecodable:
    """Stands in for a request whose bytes did not parse.

    Attributes:
        detail: The parser's message (cut to MAX_DETAIL_CHARS).
    """

    __slots__ = ("detail",)

    def __init__(self, detail: str) -> None:
        self.detail = detail[:MAX_DETAIL_CHARS]


def _safe(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # noqa: BLE001 - any parse failure is the caller's input
            return Undecodable(f"{exc.__class__.__name__}: {exc}")

    return parse


def _error(method: str, bad: Undecodable) -> InvalidArgument:
    return InvalidArgument(f"request: cannot parse the {method} request message "
                           f"({bad.detail})", field="request", reason="MALFORMED_REQUEST")


def _guarded(method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(behavior):
        async def run_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, Undecodable):
                await grpc_errors.abort(context, _error(method, request))
            async for item in behavior(request, context):
                yield item

        return run_stream

    async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            await grpc_errors.abort(context, _error(method, request))
        result = behavior(request, context)
        return await result if inspect.isawaitable(result) else result

    return run


def guard_handler(method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """``handler`` with a deserializer that never raises and a behavior that answers
    undecodable requests with INVALID_ARGUMENT; other handlers are returned as is."""
    deserializer = handler.request_deserializer
    if deserializer is None or handler.request_streaming:
        return handler
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(
            _guarded(method, handler.unary_unary), _safe(deserializer),
            handler.response_serializer)
    return grpc.unary_stream_rpc_method_handler(
        _guarded(method, handler.unary_stream), _safe(deserializer),
        handler.response_serializer)


class DecodeGuardInterceptor(WrappingInterceptor):
    """Applies :func:`guard_handler` to every method (each handler wrapped once).

    Put it last in the interceptor list, so that authentication decides before a
    request's bytes matter.
    """

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """The method's handler with its request decoding guarded."""
        return guard_handler(method, handler)
