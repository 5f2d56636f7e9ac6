"""Listeners of the gateway and the one error every one of them raises when it cannot bind.

The gateway listens on up to three addresses: gRPC (DTQ_LISTEN), the Prometheus
endpoint (DTQ_METRICS_PORT) and the dashboard (DTQ_DASHBOARD_PORT). Each one that
cannot be bound raises :class:`ListenError`; the gateway then stops what it had
started and ``dtq-gateway`` logs one line, ``gateway failed: <listener> cannot listen
on <host:port>: <reason>``, and exits 1.
"""

from __future__ import annotations

import errno
import os
import socket


class ListenError(OSError):
    """A listener of the gateway cannot bind its address.

    Attributes:
        listener: which one: ``"gRPC"``, ``"metrics"`` or ``"dashboard"``.
        address: the address as configured, ``host:port``.
        reason: why, as the OS says it (e.g. ``Address already in use``).
    """

    def __init__(self, listener: str, address: str, reason: str) -> None:
        super().__init__(f"{listener} cannot listen on {address}: {reason}")
        self.listener = listener
        self.address = address
        self.reason = reason


def reason_of(exc: OSError) -> str:
    """The OS's short words for ``exc`` (``Address already in use``), whatever library
    wrapped it in a longer message."""
    return os.strerror(exc.errno) if exc.errno else str(exc)


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as ``(host, port)``; the host without brackets.

    Raises:
        ValueError: no port, or a port that is not a number.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"not host:port: {address!r}")
    return host.strip("[]"), int(port)


def check_free(listener: str, address: str, reuseport: bool = False) -> None:
    """Raise :class:`ListenError` when ``address`` (``host:port``) cannot be bound now.

    grpc reports a taken port only as ``RuntimeError: Failed to bind`` after logging
    its own error line, so the gRPC address is tried here first with a plain socket
    bound like grpc binds (SO_REUSEADDR: a TIME_WAIT connection does not count, a live
    listener does). Port 0 (any free port), a host name that does not resolve, or an
    address this check cannot parse are left to grpc, which still refuses them.

    Args:
        listener: the listener's name for the message (``"gRPC"``).
        address: ``host:port`` as configured.
        reuseport: bind with SO_REUSEPORT too, as grpc does with DTQ_LISTEN_REUSEPORT:
            the sibling processes of DTQ_GATEWAY_PROCESSES (which set it) do not count
            then, a program that holds the port without it still does.

    Raises:
        ListenError: the address is in use or may not be bound (EADDRINUSE,
            EADDRNOTAVAIL, EACCES).
    """
    try:
        host, port = split_address(address)
    except ValueError:
        return
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError):
        return
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuseport:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            try:
                sock.bind(sockaddr)
            except OSError as exc:
                if exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
                    raise ListenError(listener, address, reason_of(exc)) from None
                return
