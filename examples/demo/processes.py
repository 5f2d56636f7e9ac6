"""Starts and stops the demo's processes: one gateway, Python and Node workers.

Every process gets its own log file (default under ``.dtq/demo/``) so the progress bar and
the summary stay readable; the gateway's first log line (which says whether it
started an embedded redis-server) is echoed to the terminal, and the tail of a
log is shown when a process fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_LOG_DIR = ROOT / ".dtq" / "demo"
NODE_DIR = ROOT / "examples" / "node-worker"
GO_WORKER_BIN = ROOT / "clients" / "go" / "bin" / "dtq-conformance-worker"
#: How often :func:`stop` looks whether its processes have exited (s).
STOP_POLL_S = 0.05
_WILDCARD_HOSTS = {"0.0.0.0", "::", "[::]", ""}


class DemoError(RuntimeError):
    """The demo cannot go on (message says why, in one line)."""


@dataclass(frozen=True)
class Endpoints:
    """Where the demo's gateway listens, from ``DTQ_LISTEN`` / ``DTQ_METRICS_PORT``.

    Attributes:
        listen: gRPC listen address given to the gateway (host:port).
        target: Address clients dial (a wildcard host becomes 127.0.0.1).
        metrics_port: Prometheus HTTP port (0 = disabled).
        redis_url: ``DTQ_REDIS_URL`` ("" = the gateway starts an embedded Redis).
    """

    listen: str
    target: str
    metrics_port: int
    redis_url: str

    @property
    def host(self) -> str:
        """Host part of the dial target."""
        return self.target.rpartition(":")[0]

    @property
    def metrics_url(self) -> str:
        """URL of the Prometheus endpoint ("" when disabled)."""
        return f"http://{self.host}:{self.metrics_port}/metrics" if self.metrics_port else ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Endpoints:
        """Read the endpoints the gateway will use from the environment."""
        listen = environ.get("DTQ_LISTEN", "127.0.0.1:50051")
        host, sep, port = listen.rpartition(":")
        if not sep or not port.isdigit():
            raise DemoError(f"DTQ_LISTEN must be host:port (got {listen!r})")
        dial_host = "127.0.0.1" if host in _WILDCARD_HOSTS else host
        raw_metrics = environ.get("DTQ_METRICS_PORT", "9464")
        if not raw_metrics.isdigit():
            raise DemoError(f"DTQ_METRICS_PORT must be a port number (got {raw_metrics!r})")
        return cls(listen=listen, target=f"{dial_host}:{port}",
                   metrics_port=int(raw_metrics), redis_url=environ.get("DTQ_REDIS_URL", ""))


def ensure_port_free(host: str, port: int, what: str) -> None:
    """Fail early when something already listens on host:port.

    A second gateway already on the port would otherwise serve the demo and the
    summary would describe the wrong system.

    Raises:
        DemoError: The port is taken.
    """
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR: connections of an earlier run in TIME_WAIT do not count,
        # a live listener still does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise DemoError(f"{what} port {host}:{port} is not free ({exc.strerror}); "
                            f"choose another with the environment variable") from None


@dataclass
class Proc:
    """A child process and its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def tail(self, lines: int = 20) -> str:
        """The last lines of the process log (JSON records shown as level and message)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(_readable(line) for line in text.splitlines()[-lines:])

    def first_line(self) -> str:
        """The first log line, reduced to its message when it is a JSON record."""
        try:
            with self.log_path.open(errors="replace") as fh:
                line = fh.readline().strip()
        except OSError:
            return ""
        record = _json_record(line)
        return str(record.get("message") or record.get("msg") or line) if record else line


def _json_record(line: str) -> dict | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _readable(line: str) -> str:
    record = _json_record(line)
    if not record:
        return line
    message = record.get("message") or record.get("msg") or line
    return f"  {str(record.get('level', '')).upper()} {message}"


#: Every process the demo started, in order (:func:`stop_all` stops them all).
SPAWNED: list[Proc] = []


@contextlib.contextmanager
def interrupts_counted() -> Iterator[list[int]]:
    """For the block, SIGINT and SIGTERM raise nothing: each one is appended to the
    yielded list (main thread only)."""
    noted: list[int] = []

    def note(signum: int, frame: object) -> None:
        noted.append(signum)

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield noted
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back for the block, then raise KeyboardInterrupt if one
    came (a blocked signal mask would be inherited by the child instead)."""
    with interrupts_counted() as noted:
        yield
    if noted:
        raise KeyboardInterrupt


def _spawn(name: str, cmd: list[str], env: Mapping[str, str], log_dir: Path) -> Proc:
    """Start ``cmd`` with its output in ``log_dir/<name>.log`` and record it in SPAWNED.

    The child gets a process group of its own, so a Ctrl-C in the terminal reaches the
    demo alone, which then stops its children in order (workers first, while the
    gateway still takes their results; then the gateway, which stops its embedded
    Redis). An interrupt during the start waits until the child is recorded: it never
    leaves a child the demo does not know of.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with _interrupts_deferred(), log_path.open("wb") as fh:
        popen = subprocess.Popen(cmd, cwd=ROOT, env=dict(env), stdout=fh,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 process_group=0)
        proc = Proc(name, popen, log_path)
        SPAWNED.append(proc)
    log.debug("started %s pid %d: %s", name, popen.pid, " ".join(cmd))
    return proc


def child_env(base: Mapping[str, str], endpoints: Endpoints) -> dict[str, str]:
    """Environment of every child: the caller's, plus the gateway address."""
    env = dict(base)
    env["PYTHONUNBUFFERED"] = "1"
    env["DTQ_GATEWAY"] = endpoints.target
    # dtq-pyworker imports examples.demo.handlers: the repository must be importable.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), base.get("PYTHONPATH", "")) if p)
    return env


def start_gateway(env: Mapping[str, str], log_dir: Path) -> Proc:
    """Start ``python -m dtq_gateway`` (it reads every ``DTQ_*`` variable itself)."""
    return _spawn("gateway", [sys.executable, "-m", "dtq_gateway"], env, log_dir)


def wait_gateway_ready(proc: Proc, target: str, timeout_s: float = 60.0) -> None:
    """Wait until the gateway accepts gRPC connections and reports SERVING.

    The wait runs on grpc.aio under ``asyncio.run``: Ctrl-C cancels it cleanly
    (KeyboardInterrupt is raised once the channel is closed). A KeyboardInterrupt
    inside a blocking call of the sync grpc API could leave the channel's lock held,
    and the interpreter then hung at exit while closing the channel.

    Args:
        proc: The gateway process (its early exit fails the wait at once).
        target: Address to dial.
        timeout_s: Overall deadline (s); the embedded Redis starts within it.

    Raises:
        DemoError: The gateway exited or did not become ready in time.
        KeyboardInterrupt: Ctrl-C (or SIGTERM) while waiting.
    """
    asyncio.run(_wait_ready(proc, target, timeout_s))


async def _wait_ready(proc: Proc, target: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(target) as channel:
        while True:
            if proc.popen.poll() is not None:
                raise DemoError(f"the gateway exited with code {proc.popen.returncode}:\n"
                                f"{proc.tail()}")
            if time.monotonic() > deadline:
                raise DemoError(f"the gateway did not become ready on {target} "
                                f"within {timeout_s:.0f} s:\n{proc.tail()}")
            try:
                await asyncio.wait_for(channel.channel_ready(), timeout=0.5)
            except TimeoutError:
                continue
            if await _serving(channel):
                return
            await asyncio.sleep(0.1)  # channel is up but health says NOT_SERVING yet


async def _serving(channel: grpc.aio.Channel) -> bool:
    """True when the standard health service says SERVING (or is not offered)."""
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        resp = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
    except grpc.aio.AioRpcError as err:
        return err.code() == grpc.StatusCode.UNIMPLEMENTED
    return resp.status == health_pb2.HealthCheckResponse.SERVING


def pyworker_command() -> list[str]:
    """The ``dtq-pyworker`` console script next to this interpreter (or on PATH)."""
    beside = Path(sys.executable).with_name("dtq-pyworker")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("dtq-pyworker")
    if not found:
        raise DemoError("dtq-pyworker not found: run `make install` first")
    return [found]


def start_python_worker(index: int, env: Mapping[str, str], target: str,
                        worker_id: str, log_dir: Path) -> Proc:
    """Start ``dtq-pyworker examples.demo.handlers:worker`` with the given worker id."""
    cmd = pyworker_command() + ["examples.demo.handlers:worker", "--target", target,
                                "--queues", "demo", "--worker-id", worker_id]
    return _spawn(f"pyworker-{index}", cmd, env, log_dir)


def node_worker_available() -> bool:
    """True when the Node worker is installed (node_modules present) and node is on PATH."""
    return (NODE_DIR / "node_modules").is_dir() and (NODE_DIR / "index.js").is_file() \
        and shutil.which("node") is not None


def start_node_worker(env: Mapping[str, str], worker_id: str, log_dir: Path) -> Proc:
    """Start ``node examples/node-worker/index.js`` on queue demo."""
    node_env = dict(env, DTQ_QUEUES="demo", DTQ_WORKER_ID=worker_id)
    return _spawn("node-worker", [shutil.which("node") or "node",
                                  str(NODE_DIR / "index.js")], node_env, log_dir)


def go_worker_available() -> bool:
    """True when the Go worker binary is built (make install builds it where Go is installed)."""
    return GO_WORKER_BIN.is_file()


def start_go_worker(env: Mapping[str, str], worker_id: str, log_dir: Path) -> Proc:
    """Start the Go worker (clients/go/bin/dtq-conformance-worker) on queue demo."""
    go_env = dict(env, DTQ_QUEUES="demo", DTQ_WORKER_ID=worker_id, DTQ_CONCURRENCY="8")
    return _spawn("go-worker", [str(GO_WORKER_BIN)], go_env, log_dir)


def stop(procs: list[Proc], timeout_s: float,
         hurry: Callable[[], bool] = lambda: False) -> list[str]:
    """SIGTERM every process, wait for all, SIGKILL the ones still running.

    Args:
        procs: Processes to stop together.
        timeout_s: Grace period for all of them (s).
        hurry: Polled while waiting; once it returns True (the user pressed Ctrl-C
            again) what still runs is killed at once.

    Returns:
        The names of processes that had to be killed.
    """
    for p in procs:
        if p.popen.poll() is None:
            p.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while any(p.popen.poll() is None for p in procs):
        if time.monotonic() > deadline:
            log.warning("not stopped within %.0f s: killing what still runs", timeout_s)
            break
        if hurry():
            log.warning("interrupted again: killing what still runs")
            break
        time.sleep(STOP_POLL_S)
    killed = []
    for p in procs:
        if p.popen.poll() is None:
            p.popen.kill()
            p.popen.wait()
            killed.append(p.name)
    return killed
