"""Channels and stubs for the gateway: TLS, bearer token, message size limits."""

from __future__ import annotations

import functools
import ipaddress
import json
import os
from dataclasses import dataclass
from typing import Any

import grpc

from dtq_proto import dtq_pb2_grpc
from dtq_pyworker.connect import ConnectConfig, TLSConfig

DEFAULT_TARGET = "127.0.0.1:50051"
#: The gateway accepts 64 MiB messages; grpc's 4 MiB default is too small for
#: large payloads delivered on the Lease stream.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: Reconnect backoff of the worker, in seconds: the Lease-stream reconnect loop and
#: the channel's own connection backoff both start at the initial step and stop
#: growing at the cap, so a worker is back at most about the cap (plus 20 % jitter)
#: after its gateway serves again. Without the channel options grpc backs off up
#: to 120 s on its own, and calls made meanwhile fail at once with the cached
#: connect error however short the worker's own backoff is.
RECONNECT_INITIAL_S = 0.1
RECONNECT_MAX_S = 5.0
#: HTTP/2 keepalive of worker and client channels, in ms: a PING every 10 s, also
#: while no call is open and no data flows (an idle Lease stream sends nothing), and
#: a connection whose PING is not answered within 5 s is closed and reconnected. So a
#: black-holed connection (no FIN or RST ever arrives) is found within 15 s. The
#: gateway accepts client pings this frequent (DTQ_GRPC_MIN_PING_INTERVAL_MS, 5 s).
KEEPALIVE_TIME_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 5_000
BROKER_METHODS = ("Enqueue", "EnqueueBatch", "Lease", "Heartbeat", "Ack", "Fail", "GetTask",
                  "CancelTask")
#: Calls the producer clients (Client, AsyncClient, AdminClient) send again when they
#: fail with UNAVAILABLE, by service: the read-only ones. Enqueue/EnqueueBatch are
#: left out (a resend after a first attempt that ran creates a second task unless the
#: request has an idempotency key), CancelTask too (a second cancel of a queued task
#: answers FAILED_PRECONDITION TASK_TERMINAL and appends a second audit entry), and
#: so are Admin calls that change state (each appends to the audit stream) and the
#: worker's Lease/Heartbeat/Ack/Fail, which it resends itself.
RETRIED_METHODS: dict[str, tuple[str, ...]] = {
    "dtq.v1.Broker": ("GetTask",),
    "dtq.v1.Admin": ("ListQueues", "GetQueueStats", "ListDeadLetters", "ListWorkers",
                     "ListRecentTasks", "ListAudit", "GetSchedule", "ListSchedules",
                     "ListRateLimits"),
}
#: grpc retry policy of :data:`RETRIED_METHODS`: up to 5 attempts (grpc's cap), the
#: n-th retry after about initial × multiplierⁿ⁻¹ seconds (capped at the max, ±20 %
#: jitter): 0.25 + 0.5 + 1 + 2 s, at least 3 s in all. An attempt made while the
#: channel waits out its reconnect backoff fails at once, so the clients' channels
#: reconnect at least every :data:`CLIENT_RECONNECT_MAX_S` (+20 %): a gateway back
#: within about 1.8 s of the first failure answers the call.
RETRY_MAX_ATTEMPTS = 5
RETRY_INITIAL_BACKOFF_S = 0.25
RETRY_MAX_BACKOFF_S = 2.0
RETRY_BACKOFF_MULTIPLIER = 2
#: Cap of the connection backoff of a channel with retries (s): see the retry policy.
CLIENT_RECONNECT_MAX_S = 1.0
_TRUE = {"1", "true", "yes", "on"}


#: grpc target schemes whose address is a path or id, not HOST:PORT
_PATH_SCHEMES = ("unix:", "unix-abstract:", "vsock:")
#: grpc target schemes whose address is a comma list of IP:PORT (ipv6: [addr]:port)
_IP_SCHEMES = ("ipv4:", "ipv6:")


def check_target(target: str, field: str = "target") -> str:
    """``target`` if it is a gateway address grpc reads as meant, else ValueError.

    Accepted: ``HOST:PORT`` with a port of 1..65535, where HOST is a name or IPv4
    address, or an IPv6 address in brackets (``[::1]:50051``); the same after
    ``dns:``, ``dns:///`` or ``dns://AUTHORITY/``; ``ipv4:`` or ``ipv6:`` (optionally
    ``///``) and a comma list of such addresses, each IPv6 one in brackets; and
    ``unix:PATH``, ``unix:///ABSOLUTE-PATH``, ``unix-abstract:NAME``, ``vsock:CID:PORT``
    with a non-empty address. grpc itself wraps a port above 65535 round (88697 reaches
    23161), sends a target without port to 443, reads a bare IPv6 address such as
    ``::1`` as host ``::`` and port 1, and takes any other scheme (``http://``) for
    part of a DNS name that never resolves.

    Raises:
        ValueError: naming ``field``: empty, whitespace, no valid port at the end, an
            IPv6 address without brackets, an unknown scheme or an empty path.
    """
    if not target or any(c.isspace() for c in target):
        raise ValueError(f"{field}: {target!r} is not a gateway address (HOST:PORT)")
    if target.startswith(_PATH_SCHEMES):
        path = target.partition(":")[2]
        if not path or path == "//" or (path.startswith("//") and not path.startswith("///")):
            raise ValueError(f"{field}: {target!r} has no path or name after the scheme "
                             "(unix:PATH, unix:///ABSOLUTE-PATH)")
        return target
    if target.startswith(_IP_SCHEMES):
        scheme, _, rest = target.partition(":")
        rest = rest.removeprefix("///")
        for address in rest.split(","):
            _check_host_port(address, target, field, ipv6=scheme == "ipv6")
        return target
    address = target
    if target.startswith("dns:"):
        address = target[4:]
        if address.startswith("//"):
            _, slash, address = address[2:].partition("/")
            if not slash:
                raise ValueError(f"{field}: {target!r} is not dns://[AUTHORITY]/HOST:PORT")
    elif "://" in target:
        raise ValueError(f"{field}: {target!r} has a scheme grpc cannot dial (use HOST:PORT "
                         "or dns:///HOST:PORT)")
    _check_host_port(address, target, field)
    return target


def _check_host_port(address: str, target: str, field: str, ipv6: bool | None = None) -> None:
    """Raise ValueError naming ``field`` unless ``address`` is HOST:PORT with a port of
    1..65535 and a HOST grpc reads as meant: with ``ipv6`` True an IPv6 address in
    brackets, with ``ipv6`` False an IPv4 address, with None either a bracketed IPv6
    address or a non-empty name or IPv4 address without ':', '[', ']' or '/'."""
    host, sep, port = address.rpartition(":")
    if not (sep and port.isascii() and port.isdigit() and len(port) <= 5
            and 1 <= int(port) <= 65535):
        raise ValueError(f"{field}: {target!r} is not HOST:PORT with a port of 1..65535")
    if host.startswith("[") and host.endswith("]") and ipv6 is not False:
        if _is_ip(host[1:-1], ipaddress.IPv6Address):
            return
    elif ipv6 is False:
        if _is_ip(host, ipaddress.IPv4Address):
            return
    elif host and not ipv6 and not any(c in host for c in ":[]/"):
        return
    raise ValueError(f"{field}: {target!r} is not HOST:PORT with HOST a name or IP address "
                     "(an IPv6 address in brackets: [::1]:50051)")


def _is_ip(text: str, kind: type[ipaddress.IPv4Address | ipaddress.IPv6Address]
           ) -> bool:
    try:
        kind(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Connection:
    """How to reach a gateway, resolved (environment applied) from a
    :class:`~dtq_pyworker.connect.ConnectConfig`.

    Attributes:
        target: host:port.
        token: Bearer token sent as ``authorization: Bearer <token>`` ("" = none).
        tls: Use TLS.
        tls_ca: CA bundle PEM path for TLS ("" = system roots).
        tls_cert: Client certificate PEM path for mTLS ("" = none).
        tls_key: Client private key PEM path for mTLS ("" = none).
        server_name: Name the gateway's certificate must hold ("" = the target's host).
    """

    target: str
    token: str = ""
    tls: bool = False
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    server_name: str = ""

    @classmethod
    def of(cls, config: ConnectConfig) -> Connection:
        """``config`` with unset values filled from ``DTQ_GATEWAY``, ``DTQ_TOKEN``,
        ``DTQ_TLS`` and ``DTQ_TLS_CA`` (see :class:`ConnectConfig`).

        Raises:
            ValueError: the address is not one grpc reads as meant (:func:`check_target`).
        """
        env = os.environ
        env_ca = env.get("DTQ_TLS_CA", "").strip()
        tls = config.tls
        if tls is None:
            tls = env.get("DTQ_TLS", "").strip().lower() in _TRUE or bool(env_ca)
        files = tls if isinstance(tls, TLSConfig) else TLSConfig()
        address = check_target(config.target or env.get("DTQ_GATEWAY", "").strip()
                               or DEFAULT_TARGET, "target" if config.target else "DTQ_GATEWAY")
        token = config.token if config.token is not None else env.get("DTQ_TOKEN", "").strip()
        return cls(target=address, token=token, tls=tls is not False,
                   tls_ca=files.ca_path or env_ca, tls_cert=files.cert_path,
                   tls_key=files.key_path, server_name=files.server_name)

    @classmethod
    def resolve(cls, target: str | None = None, *, token: str | None = None,
                tls: bool | None = None, tls_ca: str | None = None,
                tls_cert: str | None = None, tls_key: str | None = None,
                config: ConnectConfig | None = None) -> Connection:
        """:meth:`of` the ``config``, or of the config the separate values describe
        (:meth:`ConnectConfig.from_keywords`); a ``target`` replaces the config's.

        TLS is on when asked for, when ``DTQ_TLS`` is true, or when a CA or a
        client certificate is given.

        Raises:
            ValueError: the address is not one grpc reads as meant (:func:`check_target`).
        """
        if config is None:
            config = ConnectConfig.from_keywords(target, token=token, tls=tls, tls_ca=tls_ca,
                                                 tls_cert=tls_cert, tls_key=tls_key)
        elif target:
            config = ConnectConfig(target, config.tls, config.token)
        return cls.of(config)

    def credentials(self) -> grpc.ChannelCredentials | None:
        """Channel credentials for TLS, or None for plaintext."""
        if not self.tls:
            return None
        root = _read(self.tls_ca)
        cert, key = _read(self.tls_cert), _read(self.tls_key)
        return grpc.ssl_channel_credentials(root_certificates=root, private_key=key,
                                            certificate_chain=cert)

    def channel(self, *, aio: bool, options: list[tuple[str, Any]] | None = None,
                reconnect_max_s: float = RECONNECT_MAX_S, retries: bool = False) -> Any:
        """A new grpc (``aio=False``) or grpc.aio (``aio=True``) channel.

        Args:
            aio: Build a grpc.aio channel.
            options: Extra grpc channel options; one named like a default
                (:func:`default_options`) replaces it, and a ``grpc.service_config``
                replaces the retry policy.
            reconnect_max_s: Cap of the channel's connection backoff, in seconds (at
                most :data:`CLIENT_RECONNECT_MAX_S` with ``retries``).
            retries: Send :data:`RETRIED_METHODS` again on UNAVAILABLE
                (:func:`retry_service_config`); the producer clients' channels.
        """
        if retries:
            reconnect_max_s = min(reconnect_max_s, CLIENT_RECONNECT_MAX_S)
        merged = dict(default_options(reconnect_max_s))
        if retries:
            merged["grpc.service_config"] = retry_service_config()
        if self.tls and self.server_name:
            merged["grpc.ssl_target_name_override"] = self.server_name
        merged.update(options or [])
        opts = list(merged.items())
        module = grpc.aio if aio else grpc
        creds = self.credentials()
        if creds is None:
            return module.insecure_channel(self.target, options=opts)
        return module.secure_channel(self.target, creds, options=opts)

    def stub(self, channel: Any, service: str = "Broker") -> Any:
        """A stub of ``service`` ("Broker", "Admin" or "Events") whose calls carry
        the bearer token (when one is set)."""
        stub = getattr(dtq_pb2_grpc, f"{service}Stub")(channel)
        if not self.token:
            return stub
        return _AuthStub(stub, (("authorization", f"Bearer {self.token}"),))


def default_options(reconnect_max_s: float = RECONNECT_MAX_S) -> list[tuple[str, Any]]:
    """Channel options of every worker and client channel: message size limits,
    keepalive (:data:`KEEPALIVE_TIME_MS`) and the reconnect backoff
    (:data:`RECONNECT_INITIAL_S` .. ``reconnect_max_s``, in seconds)."""
    cap_ms = max(int(RECONNECT_INITIAL_S * 1000), int(reconnect_max_s * 1000))
    return [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
            ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            # grpc >= 1.5x waits for a PING ack this long (default 60 s), whatever
            # keepalive_timeout_ms says: both must be set for the timeout to hold
            ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),  # 0 = ping even when nothing flows
            ("grpc.initial_reconnect_backoff_ms", int(RECONNECT_INITIAL_S * 1000)),
            ("grpc.max_reconnect_backoff_ms", cap_ms),
            # the least time one connection attempt may take (grpc: 20 s); a black-holed
            # SYN then also gives up after the cap
            ("grpc.min_reconnect_backoff_ms", cap_ms)]


def retry_service_config() -> str:
    """grpc service config (JSON) retrying :data:`RETRIED_METHODS` on UNAVAILABLE only,
    with the backoff of :data:`RETRY_MAX_ATTEMPTS` and ``RETRY_*_S``.

    grpc resends a call only until it has received the response headers, and the
    call's deadline (the client's ``timeout_s``) covers every attempt and the waits
    between them. Methods not listed get no retry policy.
    """
    return json.dumps({"methodConfig": [{
        "name": [{"service": service, "method": method}
                 for service, methods in RETRIED_METHODS.items() for method in methods],
        "retryPolicy": {
            "maxAttempts": RETRY_MAX_ATTEMPTS,
            "initialBackoff": f"{RETRY_INITIAL_BACKOFF_S}s",
            "maxBackoff": f"{RETRY_MAX_BACKOFF_S}s",
            "backoffMultiplier": RETRY_BACKOFF_MULTIPLIER,
            "retryableStatusCodes": ["UNAVAILABLE"],
        },
    }]})


class _AuthStub:
    """Stub wrapper adding call metadata to every method (the generated stubs set
    one attribute per RPC in ``__init__``)."""

    def __init__(self, stub: Any, metadata: tuple[tuple[str, str], ...]) -> None:
        for name, method in vars(stub).items():
            if callable(method):
                setattr(self, name, functools.partial(method, metadata=metadata))


def _read(path: str) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()
