"""Real processes for the chaos suite: gateways, workers, an event recorder, polling.

Every process runs in its own session with its output in a log file under the
test's temporary directory, so it can be SIGKILLed, SIGSTOPped and resumed
without touching anything else, and a failing assertion can show what it said.
The invariant every scenario ends with lives in ``chaos_invariant.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import redis

from dtq_gateway.events.events_wire import decode
from dtq_gateway.store import keys
from tests.support.redis_server import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
#: Worker app every chaos worker runs.
APP = "tests.system.apps.chaos_app:build_worker"
#: The short timings of the issue: visibility timeout and heartbeat interval (s).
VISIBILITY_S = 1.0
HEARTBEAT_S = 0.3
#: Event types that end a task.
TERMINAL_EVENTS = {"TASK_SUCCEEDED", "TASK_DEAD_LETTERED", "TASK_CANCELLED", "TASK_EXPIRED"}

T = TypeVar("T")


def wait_until(fn: Callable[[], T], timeout_s: float, what: str,
               interval_s: float = 0.05) -> T:
    """Call ``fn`` until it returns something truthy; return it.

    Raises:
        AssertionError: ``fn`` stayed falsy for ``timeout_s`` seconds (``what`` says why).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def tail(path: Path, lines: int = 30) -> str:
    """Last ``lines`` lines of a log file ("" when missing)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


class Proc:
    """One subprocess in its own session; stdout and stderr go to ``<log_dir>/<name>.log``."""

    def __init__(self, name: str, log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def spawn(self, args: list[str], env: dict[str, str] | None = None) -> None:
        """Start ``args`` with the repository root as working directory."""
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("DTQ_")}
        full_env.update(env or {})
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(args, cwd=REPO_ROOT, env=full_env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def pid(self) -> int:
        """Process id."""
        assert self.proc is not None
        return self.proc.pid

    @property
    def running(self) -> bool:
        """True while the process has not exited (a stopped process is running)."""
        return self.proc is not None and self.proc.poll() is None

    def send(self, sig: int) -> None:
        """Send ``sig`` to the process (ignored once it has exited)."""
        if self.running:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL the process and reap it."""
        if self.proc is None:
            return
        self.send(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def terminate(self, timeout_s: float = 5.0) -> None:
        """SIGCONT + SIGTERM, then SIGKILL after ``timeout_s`` seconds."""
        if not self.running:
            return
        self.send(signal.SIGCONT)
        self.send(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)  # type: ignore[union-attr]
        except subprocess.TimeoutExpired:
            self.kill()

    def cpu_s(self) -> float:
        """User + system CPU time consumed so far (s), from /proc/<pid>/stat."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def log(self) -> str:
        """Tail of the log, for assertion messages."""
        return f"--- {self.name} ---\n{tail(self.log_path)}"


class GatewayProc(Proc):
    """``python -m dtq_gateway`` on a fixed port with the chaos timings."""

    def __init__(self, redis_url: str, log_dir: Path, gateway_id: str,
                 visibility_s: float = VISIBILITY_S, heartbeat_s: float = HEARTBEAT_S,
                 extra: dict[str, str] | None = None) -> None:
        super().__init__(gateway_id, log_dir)
        self.redis_url = redis_url
        self.gateway_id = gateway_id
        self.port = free_port()
        self.visibility_s = visibility_s
        self.heartbeat_s = heartbeat_s
        self.extra = extra or {}

    @property
    def target(self) -> str:
        """host:port for clients and workers."""
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> GatewayProc:
        """Start and wait for the "listening" log line."""
        args = [sys.executable, "-m", "dtq_gateway", "--redis-url", self.redis_url,
                "--listen", self.target, "--metrics-port", "0",
                "--visibility-timeout-s", str(self.visibility_s),
                "--heartbeat-interval-s", str(self.heartbeat_s),
                "--gateway-id", self.gateway_id, "--log-format", "json",
                "--shutdown-grace-s", "1"]
        for flag, value in self.extra.items():
            args += [f"--{flag}", value]
        self.spawn(args)
        wait_until(lambda: self._listening() or self._exited(), timeout_s,
                   f"{self.name} to log 'listening'")
        assert self.running, f"gateway exited early\n{self.log()}"
        return self

    def _exited(self) -> bool:
        return not self.running

    def _listening(self) -> bool:
        for line in tail(self.log_path, 200).splitlines():
            try:
                if json.loads(line).get("message") == "listening":
                    return True
            except ValueError:
                continue
        return False


class WorkerProc(Proc):
    """``dtq-pyworker`` running the chaos app against one gateway."""

    def __init__(self, target: str, log_dir: Path, worker_id: str, run_log: Path,
                 queue: str = "chaos", concurrency: int = 4,
                 max_in_flight: int | None = None) -> None:
        super().__init__(worker_id, log_dir)
        self.target = target
        self.worker_id = worker_id
        self.run_log = run_log
        self.queue = queue
        self.concurrency = concurrency
        self.max_in_flight = max_in_flight

    def start(self) -> WorkerProc:
        """Start the worker (it connects in the background)."""
        exe = str(Path(sys.executable).with_name("dtq-pyworker"))
        args = [exe, APP, "--target", self.target, "--queues", self.queue,
                "--concurrency", str(self.concurrency), "--worker-id", self.worker_id,
                "--log-level", "INFO"]
        if self.max_in_flight:
            args += ["--max-in-flight", str(self.max_in_flight)]
        self.spawn(args, {"CHAOS_RUN_LOG": str(self.run_log), "DTQ_QUEUES": self.queue})
        return self


def read_run_log(path: Path) -> list[dict[str, Any]]:
    """Parse the chaos app's run log into dicts (event, task_id, attempt, worker_id, lease_id)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    rows = []
    for line in text.splitlines():
        parts = line.split(" ", 4)
        if len(parts) == 5:
            rows.append({"event": parts[0], "task_id": parts[1], "attempt": int(parts[2]),
                         "worker_id": parts[3], "lease_id": parts[4]})
    return rows


class EventRecorder:
    """Records every event published on ``dtq:events`` from a thread, reconnecting
    after Redis restarts (events published while disconnected are lost and
    ``reconnects`` says it happened)."""

    def __init__(self, redis_url: str,
                 connect: Callable[[], redis.Redis] | None = None) -> None:
        self.redis_url = redis_url
        #: how to reach the server to subscribe on (default: the URL); a Sentinel setup
        #: passes a function that asks the sentinels for the primary on each reconnect
        self.connect = connect or (lambda: redis.Redis.from_url(
            self.redis_url, socket_timeout=2, socket_connect_timeout=1))
        self.events: list[dict[str, Any]] = []
        self.reconnects = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._subscribed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-events", daemon=True)

    def start(self) -> EventRecorder:
        """Subscribe and wait until the subscription is confirmed."""
        self._thread.start()
        assert self._subscribed.wait(10), "events subscription not confirmed"
        return self

    def stop(self) -> None:
        """Stop the recorder thread."""
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                client = self.connect()
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                self.reconnects += 1
                self._stop.wait(0.05)
                continue
            try:
                pubsub = client.pubsub()
                pubsub.subscribe(keys.EVENTS_CHANNEL)
                while not self._stop.is_set():
                    msg = pubsub.get_message(timeout=0.1)
                    if msg is None:
                        continue
                    if msg["type"] == "subscribe":
                        self._subscribed.set()
                    elif msg["type"] == "message":
                        with self._lock:
                            self.events.extend(decode(msg["data"]) or [])
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                self.reconnects += 1
                self._stop.wait(0.02)
            finally:
                client.close()

    def snapshot(self) -> list[dict[str, Any]]:
        """A copy of the events so far, in publication order."""
        with self._lock:
            return list(self.events)

    def by_task(self) -> dict[str, list[dict[str, Any]]]:
        """Events grouped by task id (task events only), each in order."""
        grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for ev in self.snapshot():
            if ev.get("task_id"):
                grouped[ev["task_id"]].append(ev)
        return grouped

    def count(self, ev_type: str, task_id: str) -> int:
        """How many events of ``ev_type`` were seen for ``task_id``."""
        return sum(1 for ev in self.snapshot()
                   if ev["type"] == ev_type and ev.get("task_id") == task_id)
