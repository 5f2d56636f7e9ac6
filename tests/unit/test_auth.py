"""Token parsing, method → role rules, interceptor decisions and actor identity."""

from __future__ import annotations

from types import SimpleNamespace

import grpc
import pytest

from dtq_gateway.rpc import auth
from dtq_gateway.rpc.auth import AuthInterceptor, Principal, actor_of, allowed_roles, parse_tokens

TOKENS = "tok-producer-1=producer:alice, tok-worker-123=worker:w@host,tok-admin-abc==admin:ops"


def test_parse_tokens_roles_identities_and_padding() -> None:
    parsed = parse_tokens(TOKENS + ",")
    assert parsed == {"tok-producer-1": Principal("producer", "alice"),
                      "tok-worker-123": Principal("worker", "w@host"),
                      "tok-admin-abc=": Principal("admin", "ops")}
    assert parse_tokens("") == {}


@pytest.mark.parametrize("spec,message", [
    ("nocolon-token=producer", "expected token=role:identity"),
    ("no-equals-sign", "expected token=role:identity"),
    ("short=producer:a", "token must be"),
    ("tok-12345678=boss:a", "unknown role 'boss'"),
    ("tok-12345678=admin:", "identity ''"),
    ("tok-12345678=admin:has space", "identity"),
    ("tok-12345678=admin:a,tok-12345678=worker:b", "entry 2: token repeats"),
])
def test_parse_tokens_rejects_bad_input_clearly(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as exc:
        parse_tokens(spec)
    assert "tok-12345678" not in str(exc.value)  # never echo a secret


@pytest.mark.parametrize("method,roles", [
    ("/dtq.v1.Broker/Enqueue", {"producer", "admin"}),
    ("/dtq.v1.Broker/EnqueueBatch", {"producer", "admin"}),
    ("/dtq.v1.Broker/GetTask", {"producer", "admin"}),
    ("/dtq.v1.Broker/CancelTask", {"producer", "admin"}),
    ("/dtq.v1.Broker/Lease", {"worker", "admin"}),
    ("/dtq.v1.Broker/Heartbeat", {"worker", "admin"}),
    ("/dtq.v1.Broker/Ack", {"worker", "admin"}),
    ("/dtq.v1.Broker/Fail", {"worker", "admin"}),
    ("/dtq.v1.Admin/PurgeDeadLetters", {"admin"}),
    ("/dtq.v1.Admin/DeleteQueue", {"admin"}),
    ("/dtq.v1.Events/Subscribe", {"admin"}),
    ("/dtq.v1.Broker/SomethingNew", {"admin"}),
])
def test_method_roles(method: str, roles: set[str]) -> None:
    assert allowed_roles(method) == roles


@pytest.mark.parametrize("method", ["/grpc.health.v1.Health/Check",
                                    "/grpc.health.v1.Health/Watch",
                                    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"])
def test_health_and_reflection_are_open(method: str) -> None:
    assert allowed_roles(method) is None


class FakeContext:
    def __init__(self, cn: bytes | None = None) -> None:
        self.cn = cn
        self.aborted: object = None

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"x509_common_name": [self.cn]} if self.cn else {}

    async def abort_with_status(self, status: object) -> None:
        self.aborted = status
        raise grpc.RpcError("aborted")


async def _handle(method: str, metadata: tuple[tuple[str, str], ...]) -> tuple[object, object]:
    async def behavior(request: object, context: object) -> str:
        return actor_of(context)

    handler = grpc.unary_unary_rpc_method_handler(behavior)

    async def continuation(details: object) -> grpc.RpcMethodHandler:
        return handler

    interceptor = AuthInterceptor(parse_tokens(TOKENS))
    details = SimpleNamespace(method=method, invocation_metadata=metadata)
    wrapped = await interceptor.intercept_service(continuation, details)
    ctx = FakeContext()
    try:
        result = await wrapped.unary_unary(None, ctx)
    except grpc.RpcError:
        result = None
    return result, ctx.aborted


async def test_interceptor_accepts_and_exposes_identity() -> None:
    result, aborted = await _handle("/dtq.v1.Admin/ListQueues",
                                    (("authorization", "Bearer tok-admin-abc="),))
    assert (result, aborted) == ("ops", None)
    assert auth.current_principal() is None  # reset after the call


@pytest.mark.parametrize("metadata,code", [
    ((), grpc.StatusCode.UNAUTHENTICATED),
    ((("authorization", "Bearer wrong-token-1"),), grpc.StatusCode.UNAUTHENTICATED),
    ((("authorization", "Basic tok-admin-abc="),), grpc.StatusCode.UNAUTHENTICATED),
    ((("authorization", "Bearer tok-producer-1"),), grpc.StatusCode.PERMISSION_DENIED),
])
async def test_interceptor_rejects(metadata: tuple, code: grpc.StatusCode) -> None:
    result, aborted = await _handle("/dtq.v1.Admin/PurgeDeadLetters", metadata)
    assert result is None and aborted.code == code


async def test_actor_falls_back_to_peer_cn_then_anonymous() -> None:
    assert actor_of(FakeContext(b"worker-7.example")) == "worker-7.example"
    assert actor_of(FakeContext()) == "anonymous"
