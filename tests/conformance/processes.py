"""Processes the conformance suite drives: the gateway under test and the worker command.

Both run as real subprocesses in their own session (process group), with output
captured in files so a failing test can show what the process said.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import grpc

from dtq_proto import dtq_pb2, dtq_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[2]

READY_POLL_S = 0.05  # readiness probe interval, bounded by the start deadline


def tail(path: Path, lines: int = 40) -> str:
    """Last lines of a log file ("" when missing)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


class Process:
    """A subprocess in its own process group, stdout/stderr captured to files."""

    def __init__(self, name: str, log_dir: Path) -> None:
        self.name = name
        self.stdout_path = log_dir / f"{name}.out"
        self.stderr_path = log_dir / f"{name}.err"
        self.proc: subprocess.Popen[bytes] | None = None

    def spawn(self, args: str | list[str], env: dict[str, str], shell: bool) -> None:
        """Start the process (cwd = repository root)."""
        with open(self.stdout_path, "ab") as out, open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(args, shell=shell, env=env, cwd=REPO_ROOT,
                                         stdout=out, stderr=err, start_new_session=True)

    @property
    def running(self) -> bool:
        """True while the process has not exited."""
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the whole process group (reaches a command under a shell)."""
        if self.running:
            assert self.proc is not None
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def wait(self, timeout_s: float) -> int | None:
        """Exit code, or None if still running after ``timeout_s`` seconds."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL the process group and reap it."""
        if self.proc is None:
            return
        self.signal(signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def output(self) -> str:
        """Tail of the captured output, for assertion messages."""
        return (f"--- {self.name} stdout ---\n{tail(self.stdout_path)}\n"
                f"--- {self.name} stderr ---\n{tail(self.stderr_path)}")


class Gateway(Process):
    """The dtq gateway under test, on a fixed port so it can be restarted in place."""

    def __init__(self, redis_url: str, port: int, log_dir: Path, *,
                 visibility_timeout_s: float, heartbeat_interval_s: float,
                 extra_args: list[str] | None = None) -> None:
        super().__init__(f"gateway-{port}", log_dir)
        self.extra_args = list(extra_args or [])
        self.redis_url = redis_url
        self.port = port
        self.visibility_timeout_s = visibility_timeout_s
        self.heartbeat_interval_s = heartbeat_interval_s

    @property
    def address(self) -> str:
        """host:port for clients and workers."""
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> Gateway:
        """Start the gateway and wait until its Broker answers."""
        prefix = os.environ.get("DTQ_CONFORMANCE_GATEWAY_CMD", "").strip()
        base = shlex.split(prefix) if prefix else [sys.executable, "-m", "dtq_gateway"]
        args = [*base, "--redis-url", self.redis_url,
                "--listen", self.address, "--metrics-port", "0",
                "--visibility-timeout-s", str(self.visibility_timeout_s),
                "--heartbeat-interval-s", str(self.heartbeat_interval_s), *self.extra_args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("DTQ_")}
        self.spawn(args, env, shell=False)
        try:
            self.wait_ready(timeout_s)
        except BaseException:
            self.kill()  # never leave a half-started gateway behind
            raise
        return self

    def wait_ready(self, timeout_s: float) -> None:
        """Poll GetTask for an unknown id until the gateway answers it (Broker and Redis up)."""
        deadline = time.monotonic() + timeout_s
        probe = dtq_pb2.GetTaskRequest(task_id=uuid.uuid4().hex)
        with grpc.insecure_channel(self.address) as channel:
            stub = dtq_pb2_grpc.BrokerStub(channel)
            while True:
                if not self.running:
                    raise RuntimeError(f"gateway exited early\n{self.output()}")
                try:
                    stub.GetTask(probe, timeout=2)
                except grpc.RpcError as exc:
                    # NOT_FOUND: Broker and Redis answer; UNAUTHENTICATED: the same
                    # behind the auth check of a gateway that requires tokens.
                    if exc.code() in (grpc.StatusCode.NOT_FOUND,
                                      grpc.StatusCode.UNAUTHENTICATED):
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"gateway not ready after {timeout_s}s\n{self.output()}")
                time.sleep(READY_POLL_S)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s."""
        self.signal(signal.SIGTERM)
        if self.proc is not None and self.wait(15) is None:
            self.kill()


class Worker(Process):
    """The worker implementation under test, started from a shell command."""

    def __init__(self, command: str, worker_id: str, log_dir: Path, env: dict[str, str]) -> None:
        super().__init__(f"worker-{worker_id}", log_dir)
        self.command = command
        self.worker_id = worker_id
        self.env = env

    def start(self) -> Worker:
        """Run the command through /bin/sh with the suite's DTQ_* environment."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("DTQ_")}
        env.update(self.env)
        env["DTQ_WORKER_ID"] = self.worker_id
        self.spawn(self.command, env, shell=True)
        return self

    def terminate_and_wait(self, timeout_s: float) -> int | None:
        """SIGTERM the worker; its exit code, or None if it outlived ``timeout_s``."""
        self.signal(signal.SIGTERM)
        return self.wait(timeout_s)
