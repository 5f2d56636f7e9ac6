"""Channels and stubs for the gateway: TLS, bearer token, message size limits."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import grpc

from dtq_proto import dtq_pb2_grpc

DEFAULT_TARGET = "127.0.0.1:50051"
#: The gateway accepts 64 MiB messages; grpc's 4 MiB default is too small for
#: large payloads delivered on the Lease stream.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
BROKER_METHODS = ("Enqueue", "EnqueueBatch", "Lease", "Heartbeat", "Ack", "Fail", "GetTask",
                  "CancelTask")
_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class Connection:
    """How to reach a gateway.

    Attributes:
        target: host:port.
        token: Bearer token sent as ``authorization: Bearer <token>`` ("" = none).
        tls: Use TLS.
        tls_ca: CA bundle PEM path for TLS ("" = system roots).
        tls_cert: Client certificate PEM path for mTLS ("" = none).
        tls_key: Client private key PEM path for mTLS ("" = none).
    """

    target: str
    token: str = ""
    tls: bool = False
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""

    @classmethod
    def resolve(cls, target: str | None = None, *, token: str | None = None,
                tls: bool | None = None, tls_ca: str | None = None,
                tls_cert: str | None = None, tls_key: str | None = None) -> Connection:
        """Fill unset values from ``DTQ_GATEWAY``, ``DTQ_TOKEN``, ``DTQ_TLS``, ``DTQ_TLS_CA``.

        TLS is on when asked for, when ``DTQ_TLS`` is true, or when a CA or a
        client certificate is given.
        """
        env = os.environ
        ca = tls_ca if tls_ca is not None else env.get("DTQ_TLS_CA", "").strip()
        if tls is None:
            tls = env.get("DTQ_TLS", "").strip().lower() in _TRUE or bool(ca or tls_cert)
        return cls(target=target or env.get("DTQ_GATEWAY", "").strip() or DEFAULT_TARGET,
                   token=token if token is not None else env.get("DTQ_TOKEN", "").strip(),
                   tls=tls, tls_ca=ca, tls_cert=tls_cert or "", tls_key=tls_key or "")

    def credentials(self) -> grpc.ChannelCredentials | None:
        """Channel credentials for TLS, or None for plaintext."""
        if not self.tls:
            return None
        root = _read(self.tls_ca)
        cert, key = _read(self.tls_cert), _read(self.tls_key)
        return grpc.ssl_channel_credentials(root_certificates=root, private_key=key,
                                            certificate_chain=cert)

    def channel(self, *, aio: bool, options: list[tuple[str, Any]] | None = None):
        """A new grpc (``aio=False``) or grpc.aio (``aio=True``) channel."""
        opts = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES), *(options or [])]
        module = grpc.aio if aio else grpc
        creds = self.credentials()
        if creds is None:
            return module.insecure_channel(self.target, options=opts)
        return module.secure_channel(self.target, creds, options=opts)

    def stub(self, channel) -> Any:
        """A BrokerStub whose calls carry the bearer token (when one is set)."""
        stub = dtq_pb2_grpc.BrokerStub(channel)
        if not self.token:
            return stub
        return _AuthStub(stub, (("authorization", f"Bearer {self.token}"),))


class _AuthStub:
    """BrokerStub wrapper adding call metadata to every method."""

    def __init__(self, stub: Any, metadata: tuple[tuple[str, str], ...]) -> None:
        for name in BROKER_METHODS:
            setattr(self, name, functools.partial(getattr(stub, name), metadata=metadata))


def _read(path: str) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()
