"""Bearer-token authentication with roles, and the caller identity used by audit.

``DTQ_AUTH_TOKENS`` holds ``token=role:identity`` entries separated by commas.
Roles are ``producer`` (Enqueue, EnqueueBatch, GetTask, CancelTask), ``worker``
(Lease, Heartbeat, Ack, Fail), ``scaler`` (KEDA's ``externalscaler.ExternalScaler``:
read-only queue figures) and ``admin`` (everything). KEDA sends no call metadata, so
a scaler call without an ``authorization`` header may carry its token in its trigger
metadata instead (``scalerMetadata`` key ``token``, or ``tokenFromEnv``, whose value
KEDA resolves from the scale target's environment). Health checks and
server reflection are always open so probes and ``grpcurl list`` work.

:class:`AuthInterceptor` checks the ``authorization: Bearer <token>`` metadata of
every call and answers UNAUTHENTICATED (no or unknown token) or
PERMISSION_DENIED (role not allowed), with ``google.rpc.ErrorInfo``. An accepted
call runs with its :class:`Principal` in a context variable, so handlers (and
:func:`actor_of`) know who is calling without threading it through arguments.
"""

from __future__ import annotations

import contextvars
import hmac
import inspect
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_status import rpc_status

from dtq_gateway.errors import DtqError, PermissionDenied, Unauthenticated
from dtq_gateway.rpc.grpc_errors import status_of

log = logging.getLogger(__name__)

ROLES = ("producer", "worker", "scaler", "admin")
_TOKEN_RE = re.compile(r"^[A-Za-z0-9._~+/=-]{8,512}\Z")
_IDENTITY_RE = re.compile(r"^[A-Za-z0-9_.:@/-]{1,128}\Z")

_BROKER = "/dtq.v1.Broker/"
_SCALER = "/externalscaler.ExternalScaler/"
#: Roles allowed per method; admin is allowed everywhere.
METHOD_ROLES: dict[str, frozenset[str]] = {
    **{_BROKER + m: frozenset({"producer", "admin"})
       for m in ("Enqueue", "EnqueueBatch", "GetTask", "CancelTask")},
    **{_BROKER + m: frozenset({"worker", "admin"})
       for m in ("Lease", "Heartbeat", "Ack", "Fail")},
    **{_SCALER + m: frozenset({"scaler", "admin"})
       for m in ("IsActive", "StreamIsActive", "GetMetricSpec", "GetMetrics",
                 "StreamMetricSpec")},
}
#: Method prefixes every caller may use without a token.
OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/",
                 "/grpc.reflection.v1.ServerReflection/")
_ADMIN_ONLY = frozenset({"admin"})

_principal: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "dtq_principal", default=None)


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: its role and identity (the token is not kept)."""

    role: str
    identity: str


def parse_tokens(spec: str) -> dict[str, Principal]:
    """Parse ``DTQ_AUTH_TOKENS`` (``token=role:identity,...``).

    Blank items (e.g. a trailing comma) are ignored. Tokens are 8..512 characters
    of ``[A-Za-z0-9._~+/=-]``; a token may end in ``=`` padding because the entry
    is split at its last ``=``.

    Returns:
        Token → principal.

    Raises:
        ValueError: a malformed entry, an unknown role, or a repeated token. The
            message names the entry by position, never the token itself.
    """
    tokens: dict[str, Principal] = {}
    for pos, item in enumerate(spec.split(","), start=1):
        item = item.strip()
        if not item:
            continue
        token, sep, rest = item.rpartition("=")
        role, sep2, identity = rest.partition(":")
        if not sep or not sep2:
            raise ValueError(f"entry {pos}: expected token=role:identity")
        if not _TOKEN_RE.match(token):
            raise ValueError(f"entry {pos}: token must be 8..512 characters of "
                             "[A-Za-z0-9._~+/=-]")
        if role not in ROLES:
            raise ValueError(f"entry {pos}: unknown role {role!r} "
                             f"(expected one of {', '.join(ROLES)})")
        if not _IDENTITY_RE.match(identity):
            raise ValueError(f"entry {pos}: identity {identity!r} must be 1..128 characters "
                             "of [A-Za-z0-9_.:@/-]")
        if token in tokens:
            raise ValueError(f"entry {pos}: token repeats an earlier entry")
        tokens[token] = Principal(role=role, identity=identity)
    return tokens


def allowed_roles(method: str) -> frozenset[str] | None:
    """Roles allowed to call ``method`` (full gRPC path); None = open to everyone.

    Admin and Events methods, and any method not listed, need the admin role.
    """
    if method.startswith(OPEN_PREFIXES):
        return None
    return METHOD_ROLES.get(method, _ADMIN_ONLY)


def current_principal() -> Principal | None:
    """The principal of the call being handled, or None without auth."""
    return _principal.get()


def _peer_cn(context: Any) -> str:
    try:
        names = context.auth_context().get("x509_common_name") or []
    except Exception:  # noqa: BLE001 - contexts without TLS or test doubles
        return ""
    return names[0].decode("utf-8", errors="replace") if names else ""


def actor_of(context: Any) -> str:
    """Identity recorded as the audit actor.

    The bearer-token identity when auth is on, else the mTLS client certificate
    common name when there is one, else ``"anonymous"``.
    """
    principal = _principal.get()
    if principal is not None:
        return principal.identity
    return _peer_cn(context) or "anonymous"


def caller_identity(context: Any) -> str:
    """Identity a worker id and its leases are bound to.

    ``token:<identity>`` with bearer tokens on, ``cert:<common name>`` for a client
    certificate (mTLS), both joined by ``|`` when both are present, "" for an
    anonymous caller (no auth, no client certificate): then every caller is the
    same identity and nothing is bound.
    """
    parts = []
    principal = _principal.get()
    if principal is not None:
        parts.append("token:" + principal.identity)
    cn = _peer_cn(context)
    if cn:
        parts.append("cert:" + cn)
    return "|".join(parts)


def _bearer(metadata: Any) -> str:
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return ""


def wrap_handler(handler: grpc.RpcMethodHandler, fn: Callable[[Callable[..., Any]], Any]
          ) -> grpc.RpcMethodHandler:
    """Same kind of handler with its behavior replaced by ``fn(behavior)``.

    Shared by the server interceptors (auth, metrics): ``fn`` receives the
    original behavior (coroutine function or async generator function) and
    returns the replacement.
    """
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(
            fn(handler.unary_unary), handler.request_deserializer, handler.response_serializer)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(
            fn(handler.unary_stream), handler.request_deserializer, handler.response_serializer)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(
            fn(handler.stream_unary), handler.request_deserializer, handler.response_serializer)
    return grpc.stream_stream_rpc_method_handler(
        fn(handler.stream_stream), handler.request_deserializer, handler.response_serializer)


class WrappingInterceptor(grpc.aio.ServerInterceptor):
    """Serves every method through ``wrap(method, handler)``, computed once per method.

    The registry hands out the same handler object per method, so the wrapped handler is
    cached by method name (and rebuilt only if the handler object changes), not built
    once per call. Subclasses implement :meth:`wrap`.
    """

    def __init__(self) -> None:
        # method -> (handler, wrapped handler)
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """The handler to serve ``method`` with instead of ``handler``."""
        raise NotImplementedError

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """Return the method's handler, wrapped (None for an unknown method)."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self.wrap(method, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped


def _rejecting(err: DtqError) -> Callable[[Callable[..., Any]], Any]:
    status = rpc_status.to_status(status_of(err))

    def make(behavior: Callable[..., Any]) -> Any:
        if inspect.isasyncgenfunction(behavior):
            async def reject_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                await context.abort_with_status(status)
                yield  # pragma: no cover - abort raises

            return reject_stream

        async def reject(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort_with_status(status)

        return reject

    return make


def _with_principal(principal: Principal) -> Callable[[Callable[..., Any]], Any]:
    def make(behavior: Callable[..., Any]) -> Any:
        if inspect.isasyncgenfunction(behavior):
            async def run_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                # The variable is set around each step of the inner generator, never
                # across a yield: a cancelled call's generator may be closed from another
                # context (asyncio's async-generator finalizer), where resetting a token
                # set in the call's context raises "was created in a different Context".
                inner = behavior(request, context)
                try:
                    while True:
                        token = _principal.set(principal)
                        try:
                            item = await inner.__anext__()
                        except StopAsyncIteration:
                            return
                        finally:
                            _principal.reset(token)
                        yield item
                finally:
                    token = _principal.set(principal)
                    try:
                        await inner.aclose()
                    finally:
                        _principal.reset(token)

            return run_stream

        async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
            token = _principal.set(principal)
            try:
                result = behavior(request, context)
                return await result if inspect.isawaitable(result) else result
            finally:
                _principal.reset(token)

        return run

    return make


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Checks bearer tokens and roles on every call (see module docstring).

    Args:
        tokens: token → principal, from :func:`parse_tokens`.
    """

    def __init__(self, tokens: Mapping[str, Principal]) -> None:
        self._tokens = dict(tokens)

    def _lookup(self, token: str) -> Principal | None:
        found = None
        for known, principal in self._tokens.items():  # constant time per token
            if hmac.compare_digest(known.encode(), token.encode()):
                found = principal
        return found

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """Return the method's handler, wrapped to carry the caller or to reject."""
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        roles = allowed_roles(method)
        if handler is None or roles is None:
            return handler
        token = _bearer(handler_call_details.invocation_metadata)
        if not token and method.startswith(_SCALER):
            return wrap_handler(handler, self._scaler_checked(method, roles))
        principal = self._lookup(token) if token else None
        if principal is None:
            log.info("auth rejected", extra={"method": method, "reason": "UNAUTHENTICATED"})
            return wrap_handler(handler, _rejecting(Unauthenticated(
                "missing or unknown bearer token (metadata authorization: Bearer <token>)")))
        if principal.role not in roles:
            log.info("auth rejected", extra={"method": method, "identity": principal.identity,
                                             "reason": "PERMISSION_DENIED"})
            return wrap_handler(handler, _rejecting(PermissionDenied(
                f"role {principal.role!r} may not call {method}")))
        return wrap_handler(handler, _with_principal(principal))

    def _scaler_checked(self, method: str, roles: frozenset[str]
                        ) -> Callable[[Callable[..., Any]], Any]:
        """For a KEDA call without an authorization header: check the token of its
        trigger metadata (``scalerMetadata["token"]``) once the request is decoded."""
        def judge(request: Any) -> tuple[DtqError | None, Principal | None]:
            ref = getattr(request, "scaledObjectRef", request)
            meta = ref.scalerMetadata  # KEDA keeps the key of a resolved *FromEnv value
            token = meta.get("token") or meta.get("tokenFromEnv") or ""
            principal = self._lookup(token) if token else None
            if principal is None:
                log.info("auth rejected", extra={"method": method, "reason": "UNAUTHENTICATED"})
                return Unauthenticated("missing or unknown token (scalerMetadata token, or "
                                       "metadata authorization: Bearer <token>)"), None
            if principal.role not in roles:
                log.info("auth rejected", extra={"method": method, "reason": "PERMISSION_DENIED",
                                                 "identity": principal.identity})
                return PermissionDenied(f"role {principal.role!r} may not call {method}"), None
            return None, principal

        def make(behavior: Callable[..., Any]) -> Any:
            if inspect.isasyncgenfunction(behavior):
                async def run_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                    err, principal = judge(request)
                    if err is not None:
                        await context.abort_with_status(rpc_status.to_status(status_of(err)))
                    assert principal is not None  # judge names one whenever err is None
                    async for item in _with_principal(principal)(behavior)(request, context):
                        yield item

                return run_stream

            async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
                err, principal = judge(request)
                if err is not None:
                    await context.abort_with_status(rpc_status.to_status(status_of(err)))
                assert principal is not None  # judge names one whenever err is None
                return await _with_principal(principal)(behavior)(request, context)

            return run

        return make
