"""Runs the Node Producer's tests (``node --test test/producer.test.js``) against a
real gateway on a private Redis, with a Python worker serving their queue."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from dtq_pyworker import PermanentError
from tests.conformance.conftest import NODE_WORKER
from tests.support.redis_server import RedisServer
from tests.support.threaded_gateway import ThreadedGateway

QUEUE = "node-producer"


def _echo(payload, ctx):
    return {"echo": payload}


def _boom(payload, ctx):
    raise PermanentError("kaput")


def test_node_producer_against_a_gateway() -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH")
    if not (NODE_WORKER / "node_modules" / "@grpc" / "grpc-js").is_dir():
        pytest.skip("examples/node-worker/node_modules missing: run `npm ci` there")
    server = RedisServer(appendonly=False).start()
    gw = ThreadedGateway(server.url).start()
    try:
        gw.run_worker([QUEUE], {"ok": _echo, "boom": _boom}, worker_id="w-node-producer")
        env = {**os.environ, "DTQ_TEST_GATEWAY": gw.target, "DTQ_TEST_QUEUE": QUEUE}
        for name in ("DTQ_GATEWAY", "DTQ_TOKEN", "DTQ_TLS", "DTQ_TLS_CA"):
            env.pop(name, None)
        proc = subprocess.run([node, "--test", "test/producer.test.js"], cwd=NODE_WORKER,
                              env=env, check=False, capture_output=True, text=True,
                              timeout=60)
    finally:
        gw.stop()
        server.cleanup()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "# skipped 0" in proc.stdout and "# fail 0" in proc.stdout, proc.stdout[-2000:]
