"""How a worker or client reaches its gateway: :class:`ConnectConfig` (address, TLS,
bearer token) and :class:`TLSConfig`, one typed value instead of five keyword arguments.

Example::

    from dtq_pyworker import Client, ConnectConfig, TLSConfig

    config = ConnectConfig("gateway.example.com:443", token="s3cret",
                           tls=TLSConfig(ca_path="/etc/dtq/ca.pem"))
    with Client(config) as client:
        client.enqueue("emails", "email.send", {"to": "ada@example.com"})

``Worker``, ``Client``, ``AsyncClient`` and ``AdminClient`` take one as their
``target``. Their keyword arguments ``token``, ``tls``, ``tls_ca``, ``tls_cert`` and
``tls_key`` still work, deprecated (a DeprecationWarning names the replacement); they
go away in dtq 0.3.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Any

#: The keyword arguments a ConnectConfig replaces, deprecated since dtq 0.2.
LEGACY_KEYWORDS = ("token", "tls", "tls_ca", "tls_cert", "tls_key")


@dataclass(frozen=True, slots=True)
class TLSConfig:
    """TLS to the gateway. Every path names a PEM file; "" leaves the item out.

    Attributes:
        ca_path: CA bundle the gateway's certificate is checked against; "" = the
            file named by ``DTQ_TLS_CA`` when set, else the system's roots.
        cert_path: Client certificate, for a gateway that asks for one (mTLS,
            ``DTQ_TLS_CLIENT_CA`` on the gateway); needs ``key_path``.
        key_path: The client certificate's private key.
        server_name: Host name the gateway's certificate must name, when it differs
            from the host of the target (e.g. an IP address, or a tunnel);
            "" = the target's host.

    Raises:
        ValueError: ``cert_path`` without ``key_path`` or the other way round.
    """

    ca_path: str = ""
    cert_path: str = ""
    key_path: str = ""
    server_name: str = ""

    def __post_init__(self) -> None:
        if bool(self.cert_path) != bool(self.key_path):
            raise ValueError("TLSConfig: cert_path and key_path go together (mTLS)")


@dataclass(frozen=True, slots=True)
class ConnectConfig:
    """Where the gateway is and how to authenticate to it.

    Attributes:
        target: Gateway address, ``HOST:PORT`` with a port of 1..65535 (or a grpc URI
            such as ``dns:///host:port``, ``unix:///path``); None = ``DTQ_GATEWAY``,
            else ``127.0.0.1:50051``. Checked when the worker or client is made
            (ValueError naming ``target`` or ``DTQ_GATEWAY``).
        tls: A :class:`TLSConfig` (TLS with those files), True (TLS with the system's
            roots, or ``DTQ_TLS_CA``), False (plaintext), or None: TLS when
            ``DTQ_TLS`` is true (1, true, yes, on) or ``DTQ_TLS_CA`` is set.
        token: Bearer token sent as ``authorization: Bearer <token>`` on every call;
            None = ``DTQ_TOKEN`` ("" or unset: no token).
    """

    target: str | None = None
    tls: TLSConfig | bool | None = None
    token: str | None = None

    @classmethod
    def from_keywords(cls, target: str | None = None, *, token: str | None = None,
                      tls: bool | None = None, tls_ca: str | None = None,
                      tls_cert: str | None = None, tls_key: str | None = None
                      ) -> ConnectConfig:
        """The config the deprecated keyword arguments describe, unchanged in meaning:
        ``tls`` True or False decides; unset, TLS is on when ``tls_ca`` or ``tls_cert``
        is given (else the environment decides)."""
        files = TLSConfig(tls_ca or "", tls_cert or "", tls_key or "") \
            if tls_cert or tls_key else TLSConfig(tls_ca or "")
        if tls is False:
            config_tls: TLSConfig | bool | None = False
        elif tls or tls_ca or tls_cert:
            config_tls = files
        else:
            config_tls = None
        return cls(target=target, tls=config_tls, token=token)


def connect_config(target: str | ConnectConfig | None, legacy: dict[str, Any],
                   who: str) -> ConnectConfig:
    """The ConnectConfig of a constructor's ``target`` and deprecated keywords.

    Args:
        target: The constructor's ``target``: an address, a ConnectConfig, or None.
        legacy: The deprecated keywords by name (None = not given).
        who: The constructor's name, for messages (e.g. ``"Client"``).

    Raises:
        TypeError: a ConnectConfig together with deprecated keywords.
    """
    given = [name for name in LEGACY_KEYWORDS if legacy.get(name) is not None]
    if isinstance(target, ConnectConfig):
        if given:
            raise TypeError(f"{who}: pass {', '.join(given)} inside the ConnectConfig, "
                            "not beside it")
        return target
    if given:
        warnings.warn(
            f"{who}({'=, '.join(given)}=) is deprecated and goes away in dtq 0.3: pass "
            f"{who}(ConnectConfig(target, tls=TLSConfig(ca_path=..., cert_path=..., "
            "key_path=...), token=...)) (docs/client.md, \"Connection\")",
            DeprecationWarning, stacklevel=3)
    return ConnectConfig.from_keywords(target, **{k: legacy.get(k) for k in LEGACY_KEYWORDS})


def with_target(config: ConnectConfig, target: str) -> ConnectConfig:
    """``config`` with its address replaced by ``target`` (the resolved one)."""
    return replace(config, target=target)
