"""A private Sentinel deployment for tests: one primary, one replica (or more), three
sentinels.

All on 127.0.0.1, free ports, in one temporary directory. :meth:`SentinelSetup.failover`
forces a ``SENTINEL FAILOVER`` and waits until the sentinels name the promoted replica.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from tests.support.redis_server import POLL_S, RedisServer, free_port, redis_server_binary

#: The service name the sentinels monitor.
SERVICE = "dtq"


def wait_for(check, timeout_s: float, what: str):
    """Poll ``check()`` until it returns a truthy value (returned) or the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = check()
        except (redis.RedisError, OSError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(POLL_S * 5)


class SentinelSetup:
    """Primary + ``replicas`` replicas (AOF on) and three sentinels (quorum 2)."""

    def __init__(self, directory: str | None = None, down_after_ms: int = 1000,
                 min_replicas_to_write: int = 0, replicas: int = 1) -> None:
        self.dir = Path(directory or tempfile.mkdtemp(prefix="dtq-sentinel-"))
        self.down_after_ms = down_after_ms
        #: min-replicas-to-write of both servers (with min-replicas-max-lag 1): a primary
        #: cut off from its replica refuses writes after ~1 s instead of losing them
        self.guard = ("--min-replicas-to-write", str(min_replicas_to_write),
                      "--min-replicas-max-lag", "1") if min_replicas_to_write else ()
        #: replicas of the primary (2 keep one replica beside a promoted one)
        self.replicas_n = replicas
        self.nodes: list[RedisServer] = []
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        """DTQ_REDIS_URL for sentinel mode: the three sentinels as a comma list."""
        return "redis://" + ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)

    def start(self, timeout_s: float = 30.0) -> SentinelSetup:
        """Start everything and wait until the sentinels see the replica and each other."""
        primary = RedisServer(directory=str(self.dir / "n0"), appendonly=True,
                              extra_args=self.guard)
        (self.dir / "n0").mkdir(parents=True, exist_ok=True)
        primary.start()
        self.nodes = [primary]
        for i in range(1, 1 + self.replicas_n):
            (self.dir / f"n{i}").mkdir(parents=True, exist_ok=True)
            self.nodes.append(RedisServer(
                directory=str(self.dir / f"n{i}"), appendonly=True,
                extra_args=("--replicaof", "127.0.0.1", str(primary.port),
                            *self.guard)).start())
        for i, port in enumerate(self.sentinel_ports):
            conf = self.dir / f"sentinel-{i}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                f"logfile {self.dir / f'sentinel-{i}.log'}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {primary.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} 10000\n"
                f"sentinel parallel-syncs {SERVICE} 1\n")
            self.sentinels.append(subprocess.Popen(
                [redis_server_binary(), str(conf), "--sentinel"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for replica in self.nodes[1:]:
            wait_for(lambda r=replica: redis.Redis(port=r.port, socket_timeout=1).info(
                "replication").get("master_link_status") == "up", timeout_s,
                "the replica link")
        for port in self.sentinel_ports:
            s = redis.Redis(port=port, socket_timeout=1, decode_responses=True)
            wait_for(lambda s=s: len(s.execute_command("SENTINEL", "REPLICAS", SERVICE))
                     >= self.replicas_n and len(s.execute_command("SENTINEL", "SENTINELS", SERVICE)) >= 2,
                     timeout_s, f"sentinel {port} to see the replica and the other sentinels")
            s.close()
        return self

    def primary_port(self) -> int:
        """The port the sentinels name as the primary now."""
        s = redis.Redis(port=self.sentinel_ports[0], socket_timeout=1, decode_responses=True)
        try:
            return int(s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)[1])
        finally:
            s.close()

    def failover(self, timeout_s: float = 30.0) -> int:
        """Force a failover (``SENTINEL FAILOVER``); return the new primary's port once
        every sentinel names it and it accepts writes."""
        old = self.primary_port()
        s = redis.Redis(port=self.sentinel_ports[0], socket_timeout=2)
        try:
            wait_for(lambda: s.execute_command("SENTINEL", "FAILOVER", SERVICE), timeout_s,
                     "SENTINEL FAILOVER to be accepted")
        finally:
            s.close()
        new = wait_for(lambda: (p := self.primary_port()) != old and p, timeout_s,
                       "the sentinels to name a new primary")

        def writable() -> bool:
            c = redis.Redis(port=new, socket_timeout=1)
            try:
                return c.info("replication")["role"] == "master"
            finally:
                c.close()
        wait_for(writable, timeout_s, "the promoted replica to take writes")
        return new

    def switched(self, old: int, timeout_s: float = 30.0) -> tuple[int, float]:
        """Wait until the sentinels name a primary other than port ``old``; returns its
        port and the ``time.monotonic()`` at which the first sentinel named it (polled
        every 20 ms)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for port in self.sentinel_ports:
                s = redis.Redis(port=port, socket_timeout=0.5, decode_responses=True)
                try:
                    now = int(s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME",
                                                SERVICE)[1])
                except (redis.RedisError, OSError, TypeError):
                    continue
                finally:
                    s.close()
                if now != old:
                    return now, time.monotonic()
            time.sleep(0.02)
        raise TimeoutError("timed out waiting for the sentinels to name a new primary")

    def request_failover(self) -> None:
        """Send ``SENTINEL FAILOVER`` (retried until a sentinel accepts it)."""
        s = redis.Redis(port=self.sentinel_ports[0], socket_timeout=2)
        try:
            wait_for(lambda: s.execute_command("SENTINEL", "FAILOVER", SERVICE), 30.0,
                     "SENTINEL FAILOVER to be accepted")
        finally:
            s.close()

    def node(self, port: int) -> RedisServer:
        """The server on ``port``."""
        return next(n for n in self.nodes if n.port == port)

    def stop(self) -> None:
        """Stop the sentinels and both servers and remove the directory."""
        for proc in self.sentinels:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
