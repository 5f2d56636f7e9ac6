"""Per-peer bound on open calls.

:class:`PeerLimitInterceptor` counts the calls each client IP address has open on this
gateway (Lease and Subscribe streams stay open; unary calls briefly) and answers
RESOURCE_EXHAUSTED (reason ``TOO_MANY_CALLS``, with RetryInfo) beyond
DTQ_MAX_STREAMS_PER_PEER, so one host cannot hold every slot of the process. The
connection count itself is bounded by grpc (DTQ_GRPC_MAX_CONNECTIONS, see
server.grpc_options).

Client strings in log lines are cut by :class:`dtq_gateway.logconf.TruncatingFilter`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import grpc

from dtq_gateway import metrics
from dtq_gateway.errors import DtqError
from dtq_gateway.rpc import grpc_errors
from dtq_gateway.rpc.auth import WrappingInterceptor, wrap_handler


class TooManyCalls(DtqError):
    """A client address has DTQ_MAX_STREAMS_PER_PEER calls open."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "TOO_MANY_CALLS"


def peer_address(peer: str) -> str:
    """The address part of a grpc peer string: ``ipv4:10.0.0.1:5000`` → ``ipv4:10.0.0.1``,
    ``ipv6:[::1]:5000`` → ``ipv6:[::1]``; other forms (unix sockets) as they are."""
    if peer.startswith(("ipv4:", "ipv6:")):
        return peer.rpartition(":")[0]
    return peer


class PeerLimitInterceptor(WrappingInterceptor):
    """Refuses a call while its peer address already has ``max_calls`` calls open.

    Args:
        max_calls: DTQ_MAX_STREAMS_PER_PEER.
    """

    def __init__(self, max_calls: int) -> None:
        super().__init__()
        self.max_calls = max_calls
        #: peer address -> calls open now (entries removed at 0, so the map holds only
        #: peers with open calls)
        self.open: dict[str, int] = {}

    def _enter(self, context: Any) -> str | None:
        try:
            peer = peer_address(context.peer() or "")
        except Exception:  # noqa: BLE001 - a context without a peer is not limited
            return None
        count = self.open.get(peer, 0)
        if count >= self.max_calls:
            metrics.LIMIT_REFUSALS.labels(limit="max_streams_per_peer").inc()
            raise TooManyCalls(f"this client address has {count} calls open on the gateway "
                               f"(DTQ_MAX_STREAMS_PER_PEER={self.max_calls})",
                               retry_after_ms=1000)
        self.open[peer] = count + 1
        return peer

    def _leave(self, peer: str | None) -> None:
        if peer is None:
            return
        left = self.open.get(peer, 1) - 1
        if left <= 0:
            self.open.pop(peer, None)
        else:
            self.open[peer] = left

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """The method's handler, counted per peer."""
        return wrap_handler(handler, self._counted)

    def _counted(self, behavior: Callable[..., Any]) -> Any:
        if inspect.isasyncgenfunction(behavior):
            async def run_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                try:
                    peer = self._enter(context)
                except DtqError as exc:
                    await grpc_errors.abort(context, exc)
                try:
                    async for item in behavior(request, context):
                        yield item
                finally:
                    self._leave(peer)

            return run_stream

        async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                peer = self._enter(context)
            except DtqError as exc:
                await grpc_errors.abort(context, exc)
            try:
                result = behavior(request, context)
                return await result if inspect.isawaitable(result) else result
            finally:
                self._leave(peer)

        return run
