"""A private Redis Cluster for tests: three primaries with one replica each.

Six ``redis-server --cluster-enabled yes`` processes on 127.0.0.1 (free ports, one
temporary directory), joined by ``redis-cli --cluster create --cluster-replicas 1``.
:meth:`RedisCluster.failover` promotes a replica with ``CLUSTER FAILOVER``;
:meth:`RedisCluster.kill_primary` SIGKILLs a primary and brings it back as a replica. The
benchmark ``bench.cluster_scale`` starts one with no replicas and AOF off.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import redis

from tests.support.redis_sentinel import wait_for
from tests.support.redis_server import RedisServer, free_port


def redis_cli_binary() -> str:
    """redis-cli from PATH."""
    found = shutil.which("redis-cli")
    if not found:
        raise RuntimeError("redis-cli not found on PATH")
    return found


class RedisClusterSetup:
    """``primaries`` primaries with ``replicas`` replicas each (defaults: 3 + 3, AOF on),
    node timeout ``node_timeout_ms``."""

    def __init__(self, directory: str | None = None, node_timeout_ms: int = 2000,
                 primaries: int = 3, replicas: int = 1, appendonly: bool = True) -> None:
        self.dir = Path(directory or tempfile.mkdtemp(prefix="dtq-cluster-"))
        self.node_timeout_ms = node_timeout_ms
        self.primaries_n, self.replicas_n = primaries, replicas
        self.appendonly = appendonly
        self.nodes: list[RedisServer] = []

    @property
    def url(self) -> str:
        """DTQ_REDIS_URL for cluster mode (any node will do: the first)."""
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    def start(self, timeout_s: float = 60.0) -> RedisClusterSetup:
        """Start the nodes, create the cluster, wait until every node says ``ok``."""
        for i in range(self.primaries_n * (1 + self.replicas_n)):
            d = self.dir / f"n{i}"
            d.mkdir(parents=True, exist_ok=True)
            node = RedisServer(directory=str(d), appendonly=self.appendonly, extra_args=(
                "--cluster-enabled", "yes", "--cluster-config-file", str(d / "nodes.conf"),
                "--cluster-node-timeout", str(self.node_timeout_ms),
                # the bus port defaults to port + 10000, which may be taken or > 65535
                "--cluster-port", str(free_port())))
            self.nodes.append(node.start())
        subprocess.run([redis_cli_binary(), "--cluster", "create",
                        *[f"127.0.0.1:{n.port}" for n in self.nodes],
                        "--cluster-replicas", str(self.replicas_n), "--cluster-yes"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       timeout=timeout_s)
        for n in self.nodes:
            wait_for(lambda n=n: self._info(n.port).get("cluster_state") == "ok", timeout_s,
                     f"node {n.port} to report cluster_state ok")
        wanted = self.primaries_n * self.replicas_n
        wait_for(lambda: len(self.replicas()) == wanted, timeout_s, f"{wanted} replica(s)")
        return self

    @staticmethod
    def _info(port: int) -> dict[str, str]:
        c = redis.Redis(port=port, socket_timeout=1, decode_responses=True)
        try:
            raw = c.execute_command("CLUSTER", "INFO")
        finally:
            c.close()
        if isinstance(raw, dict):
            return {str(k): str(v) for k, v in raw.items()}
        return dict(line.split(":", 1) for line in raw.splitlines() if ":" in line)

    def _role(self, port: int) -> str:
        c = redis.Redis(port=port, socket_timeout=1, decode_responses=True)
        try:
            return c.info("replication")["role"]
        finally:
            c.close()

    def primaries(self) -> list[int]:
        """Ports of the nodes that are primaries now."""
        return [n.port for n in self.nodes if self._role(n.port) == "master"]

    def replicas(self) -> list[int]:
        """Ports of the nodes that are replicas now (with their link up)."""
        out = []
        for n in self.nodes:
            c = redis.Redis(port=n.port, socket_timeout=1, decode_responses=True)
            try:
                info = c.info("replication")
            finally:
                c.close()
            if info["role"] == "slave" and info.get("master_link_status") == "up":
                out.append(n.port)
        return out

    def primary_of(self, replica_port: int) -> int:
        """Port of the primary a replica follows."""
        c = redis.Redis(port=replica_port, socket_timeout=1, decode_responses=True)
        try:
            return int(c.info("replication")["master_port"])
        finally:
            c.close()

    def failover(self, replica_port: int | None = None, timeout_s: float = 30.0) -> int:
        """Promote a replica (``CLUSTER FAILOVER``, coordinated with its primary); return
        its port once it is a primary and the cluster is ``ok`` everywhere."""
        port = replica_port or self.replicas()[0]
        c = redis.Redis(port=port, socket_timeout=2)
        try:
            c.execute_command("CLUSTER", "FAILOVER")
        finally:
            c.close()
        wait_for(lambda: self._role(port) == "master", timeout_s,
                 f"replica {port} to become a primary")
        for n in self.nodes:
            wait_for(lambda n=n: self._info(n.port).get("cluster_state") == "ok", timeout_s,
                     f"node {n.port} to report cluster_state ok after the failover")
        return port

    def replica_of(self, primary_port: int) -> int:
        """Port of a replica (link up) that follows the primary on ``primary_port``."""
        return wait_for(lambda: next((r for r in self.replicas()
                                      if self.primary_of(r) == primary_port), None),
                        30.0, f"a replica of {primary_port}")

    def node(self, port: int) -> RedisServer:
        """The node on ``port``."""
        return next(n for n in self.nodes if n.port == port)

    def kill_primary(self, port: int, timeout_s: float = 30.0) -> int:
        """SIGKILL the primary on ``port``, wait until its replica took over and the
        cluster is ``ok`` again, then start the killed node again (it rejoins as the new
        primary's replica); returns the new primary's port."""
        replica = self.replica_of(port)
        self.node(port).kill()
        wait_for(lambda: self._role(replica) == "master", timeout_s,
                 f"replica {replica} to take over from the killed {port}")
        for n in self.nodes:
            if n.port != port:
                wait_for(lambda n=n: self._info(n.port).get("cluster_state") == "ok",
                         timeout_s, f"node {n.port} to report cluster_state ok")
        self.node(port).start()
        wait_for(lambda: port in self.replicas(), timeout_s,
                 f"the restarted {port} to follow the new primary")
        return replica

    def stop(self) -> None:
        """Stop every node and remove the directory."""
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
