"""Fixtures of the worker conformance suite.

The suite starts its own redis-server and gateway and runs the worker under test
from a shell command. By default it runs every test against dtq-pyworker, the
Node.js worker, the minimal raw-stub worker of examples/raw-python-worker and
the Go worker of clients/go;
set DTQ_CONFORMANCE_WORKER_CMD to run it against another implementation instead
(see README.md).
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conformance.client import ConformanceClient
from tests.conformance.processes import REPO_ROOT, Gateway, Worker
from tests.support.redis_server import RedisServer, free_port

VISIBILITY_TIMEOUT_S = 2.0
HEARTBEAT_INTERVAL_S = 0.5
WARM_UP_TIMEOUT_S = 30.0
NODE_WORKER = REPO_ROOT / "examples" / "node-worker"
GO_WORKER_BIN = REPO_ROOT / "clients" / "go" / "bin" / "dtq-conformance-worker"
#: Tokens of gateways started for tests marked ``gateway_auth``.
ADMIN_TOKEN = "conf-admin-token"
WORKER_TOKEN = "conf-worker-token"
AUTH_TOKENS = f"{ADMIN_TOKEN}=admin:conf-admin,{WORKER_TOKEN}=worker:conf-worker"


def pytest_configure(config: pytest.Config) -> None:
    """Register the suite's marker."""
    config.addinivalue_line("markers", "gateway_auth: the gateway requires bearer tokens "
                            "(DTQ_AUTH_TOKENS); workers get DTQ_TOKEN")
    config.addinivalue_line("markers", "gateway_heartbeat_s(s): the gateway's heartbeat "
                            "interval is s seconds (visibility timeout 3 s more than that)")


def _worker_params() -> list[object]:
    custom = os.environ.get("DTQ_CONFORMANCE_WORKER_CMD", "").strip()
    if custom:
        return [pytest.param(("custom", custom), id="custom")]
    return [pytest.param(name, id=name) for name in ("pyworker", "node", "raw-python", "go")]


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Remember each phase's report so fixtures can dump process logs on failure."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


def _failed(request: pytest.FixtureRequest) -> bool:
    report = getattr(request.node, "rep_call", None)
    return report is None or report.failed


@pytest.fixture(params=_worker_params())
def worker_command(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(implementation name, shell command) of the worker under test."""
    param = request.param
    if isinstance(param, tuple):
        return param
    if param == "node":
        if shutil.which("node") is None:
            pytest.skip("node is not on PATH")
        if not (NODE_WORKER / "node_modules" / "@grpc" / "grpc-js").is_dir():
            pytest.skip("examples/node-worker/node_modules missing: run "
                        "`cd examples/node-worker && npm ci` (make install does)")
        return "node", "exec node examples/node-worker/index.js"
    if param == "go":
        if not GO_WORKER_BIN.is_file():
            pytest.skip("clients/go/bin/dtq-conformance-worker missing: make install builds "
                        "it where Go is installed (clients/go/README.md)")
        return "go", f"exec {shlex.quote(str(GO_WORKER_BIN))}"
    if param == "raw-python":
        script = "examples/raw-python-worker/worker.py"
        return "raw-python", f"exec {shlex.quote(sys.executable)} {script}"
    script = "tests/conformance/workers/pyworker_conf.py"
    return "pyworker", f"exec {shlex.quote(sys.executable)} {script}"


@pytest.fixture(scope="session")
def conformance_redis() -> Iterator[RedisServer]:
    """The suite's own redis-server (never the shared one)."""
    server = RedisServer(appendonly=False).start()
    yield server
    server.cleanup()


@pytest.fixture
def gateway(conformance_redis: RedisServer, tmp_path: Path,
            request: pytest.FixtureRequest) -> Iterator[Gateway]:
    """A fresh gateway on its own port: visibility timeout 2 s, heartbeat interval 0.5 s
    (a test marked ``gateway_heartbeat_s(s)``: heartbeat interval s, visibility timeout
    s + 3)."""
    if importlib.util.find_spec("dtq_gateway.__main__") is None:
        pytest.skip("the gateway is not built yet (dtq_gateway/__main__.py missing)")
    auth = request.node.get_closest_marker("gateway_auth") is not None
    slow = request.node.get_closest_marker("gateway_heartbeat_s")
    heartbeat_s = float(slow.args[0]) if slow else HEARTBEAT_INTERVAL_S
    gw = Gateway(conformance_redis.url, free_port(), tmp_path,
                 visibility_timeout_s=heartbeat_s + 3 if slow else VISIBILITY_TIMEOUT_S,
                 heartbeat_interval_s=heartbeat_s,
                 extra_args=["--auth-tokens", AUTH_TOKENS] if auth else None).start()
    yield gw
    gw.stop()
    if _failed(request):
        print(gw.output())


@pytest.fixture
def client(gateway: Gateway) -> Iterator[ConformanceClient]:
    """Producer/observer client connected to the gateway (admin token when auth is on)."""
    c = ConformanceClient(gateway.address, ADMIN_TOKEN if gateway.extra_args else "")
    yield c
    c.close()


@pytest.fixture
def queue() -> str:
    """A queue name of this test alone (tests share one Redis)."""
    return f"conf-{uuid.uuid4().hex[:12]}"


StartWorker = Callable[..., Worker]


@pytest.fixture
def start_worker(worker_command: tuple[str, str], gateway: Gateway, client: ConformanceClient,
                 queue: str, tmp_path: Path,
                 request: pytest.FixtureRequest) -> Iterator[StartWorker]:
    """Factory: start the worker under test on ``queue`` and wait until it runs a task.

    Keyword args: concurrency (default 2), max_in_flight (default 2 * concurrency),
    drain_grace_ms (default 10000), warm_up (default True: enqueue one conf.echo
    and wait for it, which proves the worker is connected), token (DTQ_TOKEN;
    default the worker token when the gateway requires auth, else none).
    """
    impl, command = worker_command
    started: list[Worker] = []

    def start(*, concurrency: int = 2, max_in_flight: int | None = None,
              drain_grace_ms: int = 10000, warm_up: bool = True,
              token: str | None = None) -> Worker:
        env = {
            "DTQ_GATEWAY": gateway.address, "DTQ_QUEUE": queue, "DTQ_QUEUES": queue,
            "DTQ_CONCURRENCY": str(concurrency),
            "DTQ_MAX_IN_FLIGHT": str(max_in_flight or 2 * concurrency),
            "DTQ_DRAIN_GRACE_MS": str(drain_grace_ms), "DTQ_LOG_LEVEL": "info",
        }
        if token is None and gateway.extra_args:
            token = WORKER_TOKEN
        if token:
            env["DTQ_TOKEN"] = token
        worker_id = f"conf-{impl}-{uuid.uuid4().hex[:8]}"
        worker = Worker(command, worker_id, tmp_path, env).start()
        started.append(worker)
        if warm_up:
            task_id = client.enqueue(queue, "conf.echo", {"warm_up": True})
            try:
                client.wait_terminal(task_id, WARM_UP_TIMEOUT_S)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{worker.output()}") from None
        return worker

    yield start
    for worker in started:
        worker.kill()
        if _failed(request):
            print(worker.output())
