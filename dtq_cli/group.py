"""The ``dtq`` command group: connection options, output mode, exit codes.

The command modules (``*_cmd.py``) import this module for :class:`State`,
:class:`Failure` and the shared options; :mod:`dtq_cli.main` adds their commands to
:data:`cli`, so this module imports none of them.

Connection settings come from the same environment variables as the workers
(``DTQ_GATEWAY``, ``DTQ_TOKEN``, ``DTQ_TLS``, ``DTQ_TLS_CA``); flags override them.
Every failure ends with one line on stderr and an exit code of :class:`ExitCode`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click
import grpc

from dtq_pyworker._channel import check_target
from dtq_pyworker.admin import AdminClient
from dtq_pyworker.connect import ConnectConfig
from dtq_pyworker.errors import DtqRpcError


class ExitCode(enum.IntEnum):
    """Exit codes of ``dtq`` (docs/cli.md)."""

    OK = 0
    ERROR = 1            # the gateway refused the request (bad argument, wrong state...)
    USAGE = 2            # bad command line (click's own usage errors)
    NOT_FOUND = 3        # unknown task, queue or dead-letter entry
    TASK_FAILED = 4      # wait / enqueue --wait: the task was dead-lettered
    TASK_CANCELLED = 5   # ... the task was cancelled
    TASK_EXPIRED = 6     # ... the task expired before it started
    WAIT_TIMEOUT = 7     # ... the task had not ended when the wait timed out
    UNAVAILABLE = 8      # no gateway answered (down, wrong address, deadline exceeded)
    PERMISSION = 9       # missing/unknown token, or a role that may not call this
    REDIS_UNAVAILABLE = 10  # the gateway answered, but cannot reach its Redis


_BY_CODE = {
    grpc.StatusCode.NOT_FOUND: ExitCode.NOT_FOUND,
    grpc.StatusCode.UNAVAILABLE: ExitCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: ExitCode.UNAVAILABLE,
    grpc.StatusCode.UNAUTHENTICATED: ExitCode.PERMISSION,
    grpc.StatusCode.PERMISSION_DENIED: ExitCode.PERMISSION,
}


class Failure(click.ClickException):
    """A failure printed as ``dtq: <message>`` on stderr, exiting with ``code``."""

    def __init__(self, message: str, code: ExitCode = ExitCode.ERROR) -> None:
        super().__init__(message)
        self.exit_code = int(code)  # type: ignore[misc]  # click reads it per instance

    def show(self, file: Any = None) -> None:
        click.echo(f"dtq: {self.format_message()}", err=True)


def rpc_failure(exc: DtqRpcError, target: str) -> Failure:
    """The Failure (message and exit code) for a refused gateway call.

    The message is ``CODE[ REASON]: message[ (field F)][ [hint]]``, the reason left out
    when it only repeats the code. UNAVAILABLE with reason REDIS_UNAVAILABLE (the
    gateway answered, its Redis did not) exits 10 with a hint about Redis, not 8 with
    one about the gateway address.
    """
    code = _BY_CODE.get(exc.code, ExitCode.ERROR)
    if exc.reason == "REDIS_UNAVAILABLE":
        code = ExitCode.REDIS_UNAVAILABLE
    msg = f"{exc.code.name}"
    if exc.reason and exc.reason != exc.code.name:
        msg += f" {exc.reason}"
    msg += f": {exc.message}" if exc.message else ""
    if exc.field:
        msg += f" (field {exc.field})"
    if code == ExitCode.UNAVAILABLE:
        msg += f" [gateway {target}; set --gateway or DTQ_GATEWAY]"
    elif code == ExitCode.REDIS_UNAVAILABLE:
        msg += (f" [the gateway at {target} answered but cannot reach its Redis; check that"
                " Redis is up and the gateway's DTQ_REDIS_URL]")
    elif code == ExitCode.PERMISSION:
        msg += " [set --token or DTQ_TOKEN; Admin and Events calls need an admin token]"
    return Failure(msg, code)


@dataclass
class State:
    """Options shared by every subcommand, and the client made from them on demand."""

    gateway: str | None = None
    token: str | None = None
    tls: bool | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    timeout_s: float = 10.0
    json: bool = False
    _client: AdminClient | None = field(default=None, repr=False)

    @property
    def client(self) -> AdminClient:
        """The AdminClient (made once, closed when the command ends)."""
        if self._client is None:
            config = ConnectConfig.from_keywords(
                self.gateway, token=self.token, tls=self.tls, tls_ca=self.tls_ca,
                tls_cert=self.tls_cert, tls_key=self.tls_key)
            self._client = AdminClient(config, timeout_s=self.timeout_s)
        return self._client

    @property
    def target(self) -> str:
        return self._client.target if self._client is not None else (self.gateway or "?")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class DtqGroup(click.Group):
    """Turns a refused gateway call into its message and exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DtqRpcError as exc:
            state = ctx.find_object(State)
            raise rpc_failure(exc, state.target if state else "?") from exc


def _set_json(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        ctx.ensure_object(State).json = True


def json_option(fn: Callable) -> Callable:
    """``--json`` on a subcommand (same as the group's ``--json``)."""
    return click.option("--json", "json_out", is_flag=True, expose_value=False,
                        callback=_set_json, is_eager=True,
                        help="Print one JSON document (JSON lines for tail).")(fn)


pass_state = click.make_pass_decorator(State, ensure=True)

#: Longest --timeout, in s (365 days; gRPC turns a much larger deadline into one already
#: passed, as it does 0 or a negative one: DEADLINE_EXCEEDED before anything is sent).
MAX_TIMEOUT_S = 365 * 86_400


def _not_nan(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """Refuse "nan", which passes FloatRange (every comparison with it is false)."""
    if math.isnan(value):
        raise click.BadParameter("nan is not a number of seconds", ctx, param)
    return value


def _gateway_address(ctx: click.Context, param: click.Parameter, value: str | None
                     ) -> str | None:
    """``--gateway``: an address :func:`dtq_pyworker._channel.check_target` accepts
    (HOST:PORT with a port of 1..65535, a grpc URI, ``unix:``); unset or empty means
    the default."""
    if not value:
        return None
    try:
        return check_target(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc).split(": ", 1)[1], ctx, param) from None


@click.group(name="dtq", cls=DtqGroup, context_settings={"help_option_names": ["-h", "--help"],
                                             "max_content_width": 100})
@click.option("--gateway", envvar="DTQ_GATEWAY", show_envvar=True, metavar="HOST:PORT",
              callback=_gateway_address, help="Gateway address [default: 127.0.0.1:50051].")
@click.option("--token", envvar="DTQ_TOKEN", show_envvar=True,
              help="Bearer token (admin role for Admin and Events calls when tokens are on).")
@click.option("--tls/--no-tls", default=None, envvar="DTQ_TLS", show_envvar=True,
              help="Use TLS (on by default when a CA or client certificate is given).")
@click.option("--tls-ca", envvar="DTQ_TLS_CA", show_envvar=True,
              type=click.Path(exists=True, dir_okay=False), help="CA bundle PEM.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False),
              help="Client certificate PEM (mTLS).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False),
              help="Client private key PEM (mTLS).")
@click.option("--timeout", "timeout_s", default=10.0, show_default=True,
              type=click.FloatRange(0, MAX_TIMEOUT_S, min_open=True), callback=_not_nan,
              metavar="SECONDS", help="Deadline of each call (> 0).")
@click.option("--json", "json_out", is_flag=True,
              help="Print one JSON document (JSON lines for tail) instead of tables.")
@click.version_option(package_name="dtq", prog_name="dtq")
@click.pass_context
def cli(ctx: click.Context, gateway: str | None, token: str | None, tls: bool | None,
        tls_ca: str | None, tls_cert: str | None, tls_key: str | None, timeout_s: float,
        json_out: bool) -> None:
    """dtq: enqueue, inspect and operate tasks and queues of a dtq gateway.

    Exit codes: 0 ok, 1 refused by the gateway, 2 usage, 3 not found, 4 task
    failed (dead-lettered), 5 task cancelled, 6 task expired, 7 wait timed out,
    8 gateway unavailable, 9 unauthenticated or permission denied, 10 the gateway
    cannot reach Redis.
    """
    if bool(tls_cert) != bool(tls_key):
        raise click.UsageError("--tls-cert and --tls-key go together (mTLS)")
    state = ctx.ensure_object(State)
    state.gateway, state.token, state.tls = gateway or None, token or None, tls
    state.tls_ca, state.tls_cert, state.tls_key = tls_ca or None, tls_cert, tls_key
    state.timeout_s = timeout_s
    state.json = state.json or json_out
    ctx.call_on_close(state.close)
