"""Fixtures of the ``dtq`` CLI tests: one real gateway with tokens on, on a private
redis-server, with a Python worker serving the queue ``cli``; a CliRunner helper."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from click.testing import CliRunner, Result

from dtq_cli import cli
from dtq_pyworker import AdminClient, ConnectConfig, PermanentError
from tests.support.redis_server import RedisServer
from tests.support.threaded_gateway import ADMIN_TOKEN, ThreadedGateway

_CONNECTION_ENV = ("DTQ_GATEWAY", "DTQ_TOKEN", "DTQ_TLS", "DTQ_TLS_CA")
#: Queue the worker serves; tasks in any other queue stay queued.
SERVED = "cli"


def _ok(payload, ctx):
    return {"echo": payload}


def _boom(payload, ctx):
    raise PermanentError("kaput")


async def _slow(payload, ctx):
    await asyncio.sleep(30)  # cancelled directly when the task is


@dataclass
class Env:
    """The running gateway and helpers to call the CLI against it."""

    gw: ThreadedGateway
    client: AdminClient

    def run(self, *args: str, token: str | None = ADMIN_TOKEN, input: str | None = None,
            env: dict[str, str] | None = None) -> Result:
        """Invoke ``dtq --gateway <gw> [--token T] ARGS`` in-process."""
        base = ["--gateway", self.gw.target] + (["--token", token] if token else [])
        runner = CliRunner()
        clean: dict[str, str | None] = {name: None for name in _CONNECTION_ENV}
        clean.update(env or {})
        return runner.invoke(cli, base + list(args), input=input, env=clean,
                             catch_exceptions=False)

    def json(self, *args: str, **kwargs) -> object:
        """Invoke with --json; assert exit 0; the decoded document."""
        res = self.run("--json", *args, **kwargs)
        assert res.exit_code == 0, (res.exit_code, res.output, res.stderr)
        return json.loads(res.stdout)


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    server = RedisServer(appendonly=False).start()
    gw = ThreadedGateway(server.url, auth=True).start()
    try:
        gw.run_worker([SERVED], {"ok": _ok, "boom": _boom, "slow": _slow},
                      worker_id="w-cli", concurrency=4)
        client = AdminClient(ConnectConfig(gw.target, token=ADMIN_TOKEN))
        yield Env(gw, client)
        client.close()
    finally:
        gw.stop()
        server.cleanup()
