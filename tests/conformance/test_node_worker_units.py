"""Runs the Node.js worker's own unit tests (``node --test``) inside ``make test``."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conformance.conftest import NODE_WORKER


def test_node_worker_unit_tests_pass() -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH")
    if not (NODE_WORKER / "node_modules" / "@grpc" / "grpc-js").is_dir():
        pytest.skip("examples/node-worker/node_modules missing: run `npm ci` there")
    proc = subprocess.run([node, "--test", "test/"], cwd=NODE_WORKER, check=False,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
