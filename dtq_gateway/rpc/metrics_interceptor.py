"""``dtq_rpc_duration_seconds{method, code}``: every RPC's duration, by an interceptor."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

import grpc

from dtq_gateway.metrics import RPC_DURATION_SECONDS
from dtq_gateway.rpc.auth import WrappingInterceptor, wrap_handler

_INT_CODES = {c.value[0]: c.name for c in grpc.StatusCode}


def _code_name(context: Any, exc: BaseException | None) -> str:
    """Status name of a finished call: the context's code, else from the outcome."""
    try:
        code = context.code()
    except Exception:  # noqa: BLE001 - test doubles without code()
        code = None
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(code, int):
        return _INT_CODES.get(code, "UNKNOWN")
    if exc is None:
        return "OK"
    return "CANCELLED" if isinstance(exc, asyncio.CancelledError) else "UNKNOWN"


_RPC_CHILDREN: dict[tuple[str, str], Any] = {}


def _rpc_child(method: str, code: str) -> Any:
    """The (method, code) child of the RPC histogram, cached: ``labels()`` per call
    costs a tuple, a lock and a dict lookup. Both labels are bounded."""
    child = _RPC_CHILDREN.get((method, code))
    if child is None:
        child = _RPC_CHILDREN[(method, code)] = RPC_DURATION_SECONDS.labels(
            method=method, code=code)
    return child


def _observed(method: str) -> Callable[[Callable[..., Any]], Any]:
    def make(behavior: Callable[..., Any]) -> Any:
        if inspect.isasyncgenfunction(behavior):
            async def run_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                start, exc = time.perf_counter(), None
                try:
                    async for item in behavior(request, context):
                        yield item
                except BaseException as e:
                    exc = e
                    raise
                finally:
                    _rpc_child(method, _code_name(context, exc)).observe(
                        time.perf_counter() - start)

            return run_stream

        async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
            start, exc = time.perf_counter(), None
            try:
                result = behavior(request, context)
                return await result if inspect.isawaitable(result) else result
            except BaseException as e:
                exc = e
                raise
            finally:
                _rpc_child(method, _code_name(context, exc)).observe(time.perf_counter() - start)

        return run

    return make


class MetricsInterceptor(WrappingInterceptor):
    """Observes ``dtq_rpc_duration_seconds{method, code}`` for every known method.

    Put it first in the interceptor list so calls refused by authentication are
    measured too. Unknown methods (UNIMPLEMENTED) are not observed, which keeps
    the ``method`` label bounded.
    """

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """The method's handler with a timer."""
        return wrap_handler(handler, _observed(method))
