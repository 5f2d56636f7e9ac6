"""``dtq-gateway --processes N``: one address served by N supervised gateway processes.

Real processes on a private redis-server (the chaos fixture): the supervisor starts
its children on one port (SO_REUSEPORT), restarts one that is SIGKILLed while the port
keeps serving, drains all of them on SIGTERM, refuses a port another program holds,
and its processes elect exactly one scheduler leader between them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest

from dtq_gateway.store import keys
from dtq_proto import dtq_pb2, dtq_pb2_grpc
from tests.support.redis_server import free_port
from tests.system.chaos_invariant import ChaosEnv, check_invariant
from tests.system.chaos_support import Proc, tail, wait_until

pytestmark = pytest.mark.system

GATEWAY_ID = "multi"


class Supervised(Proc):
    """``python -m dtq_gateway --processes N`` on a fixed port with per-process metrics."""

    def __init__(self, env: ChaosEnv, processes: int, port: int | None = None) -> None:
        super().__init__("supervisor", env.dir)
        self.processes = processes
        self.fixed_port = port is not None
        self.port = port or free_port()
        self.metrics_port = _free_port_run(processes)
        self.target = f"127.0.0.1:{self.port}"
        self.redis_url = env.redis.url
        env.procs.append(self)

    def spawn_group(self, redis: list[str] | None = None) -> Supervised:
        """Start the supervisor (without waiting); ``redis``: flags instead of
        ``--redis-url`` (the embedded server's)."""
        redis = ["--redis-url", self.redis_url] if redis is None else redis
        self.spawn([sys.executable, "-m", "dtq_gateway", "--processes", str(self.processes),
                    *redis, "--listen", self.target,
                    "--metrics-port", str(self.metrics_port), "--gateway-id", GATEWAY_ID,
                    "--log-format", "json", "--shutdown-grace-s", "1",
                    "--visibility-timeout-s", "2", "--heartbeat-interval-s", "0.5"])
        return self

    def start(self, timeout_s: float = 30.0, redis: list[str] | None = None) -> Supervised:
        """Start and wait until every process logged "listening".

        The metrics ports were free when picked, but any process on the host (another
        test's outgoing connection) may take one before the gateway binds it: then the
        supervisor exits at once, "Address already in use", and starts again on a new
        run of ports (at most 3 tries; any other exit fails)."""
        for _ in range(3):
            self.spawn_group(redis)
            wait_until(lambda: len(self.listening()) == self.processes or not self.running,
                       timeout_s, "every gateway process to listen")
            if self.running or "Address already in use" not in self.log():
                break
            self.metrics_port = _free_port_run(self.processes)
            if not self.fixed_port:
                self.port = free_port()
                self.target = f"127.0.0.1:{self.port}"
            os.truncate(self.log_path, 0)  # "listening" counts this try's lines only
        assert self.running, f"supervisor exited\n{self.log()}"
        return self

    def lines(self) -> list[dict]:
        """The JSON log lines of the supervisor and its processes."""
        out = []
        for line in tail(self.log_path, 100_000).splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def listening(self) -> list[str]:
        """Gateway ids of the "listening" lines so far (one per process start)."""
        return [ln.get("gateway_id") for ln in self.lines() if ln.get("message") == "listening"]

    def children(self, comm: str = "python") -> set[int]:
        """Pids of the supervisor's live child processes named ``comm*`` (from /proc)."""
        return {pid for pid, (ppid, name) in live_processes().items()
                if ppid == self.pid and name.startswith(comm)}

    def metric(self, index: int, name: str) -> float:
        """Sum of the samples of metric ``name`` on process ``index``'s /metrics."""
        url = f"http://127.0.0.1:{self.metrics_port + index}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name) and not line.startswith("#"))


def live_processes() -> dict[int, tuple[int, str]]:
    """``{pid: (parent pid, command name)}`` of every process that is not a zombie."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat.partition("(")[2].rpartition(")")[0]
        fields = stat.rpartition(")")[2].split()
        if fields[0] != "Z":
            found[int(entry.name)] = (int(fields[1]), name)
    return found


def _free_port_run(count: int) -> int:
    """The first of ``count`` consecutive free loopback ports."""
    while True:
        first = free_port()
        if all(_bindable(first + i) for i in range(1, count)):
            return first


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def enqueue_over_connections(target: str, connections: int, per_connection: int) -> list[str]:
    """Enqueue ``chaos.sleep`` tasks, each connection its own TCP connection; the ids."""
    ids = []
    for _ in range(connections):
        with grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
            stub = dtq_pb2_grpc.BrokerStub(ch)
            for _ in range(per_connection):
                reply = stub.Enqueue(dtq_pb2.EnqueueRequest(
                    queue="chaos", task_type="chaos.sleep", payload=b'{"sleep_s": 0}',
                    content_type="application/json"), timeout=10, wait_for_ready=True)
                ids.append(reply.task_id)
    return ids


def test_two_processes_share_the_port_and_run_tasks(chaos: ChaosEnv) -> None:
    group = Supervised(chaos, 2).start()
    assert sorted(group.listening()) == [f"{GATEWAY_ID}-0", f"{GATEWAY_ID}-1"]
    assert len(group.children()) == 2
    ids = enqueue_over_connections(group.target, connections=16, per_connection=2)
    served = [group.metric(i, "dtq_tasks_enqueued_total") for i in range(2)]
    assert sum(served) == 32 and all(served), served  # the kernel spread the connections
    chaos.worker(group.target, "w-multi", concurrency=4)
    tasks = check_invariant(chaos, chaos.client(group.target), ids, timeout_s=30)
    assert all(t.status == dtq_pb2.TASK_STATUS_SUCCEEDED for t in tasks.values())


def test_killed_process_is_restarted_and_the_port_keeps_serving(chaos: ChaosEnv) -> None:
    group = Supervised(chaos, 2).start()
    before = group.children()
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    ids = enqueue_over_connections(group.target, connections=8, per_connection=1)
    after = wait_until(lambda: (c := group.children()) and len(c) == 2 and victim not in c
                       and len(group.listening()) == 3 and c, 20, "a new process")
    assert len(after - before) == 1
    exits = [ln for ln in group.lines() if ln.get("message") == "gateway process exited; "
             "restarting"]
    assert [(e["pid"], e["returncode"]) for e in exits] == [(victim, -signal.SIGKILL)]
    ids += enqueue_over_connections(group.target, connections=8, per_connection=1)
    chaos.worker(group.target, "w-multi", concurrency=4)
    check_invariant(chaos, chaos.client(group.target), ids, timeout_s=30)


def test_sigterm_drains_every_process_and_exits_0(chaos: ChaosEnv) -> None:
    group = Supervised(chaos, 2).start()
    children = group.children()
    group.send(signal.SIGTERM)
    assert group.proc is not None and group.proc.wait(timeout=20) == 0, group.log()
    stopped = [ln for ln in group.lines() if ln.get("message") == "stopped"]
    assert len([ln for ln in stopped if "drain_s" in ln]) == 2, group.log()
    assert not children & live_processes().keys()


def test_processes_end_when_the_supervisor_is_killed(chaos: ChaosEnv) -> None:
    group = Supervised(chaos, 2).start()
    children = group.children()
    group.kill()  # SIGKILL: nothing forwarded; the parent-death signal stops them
    wait_until(lambda: not children & live_processes().keys(), 20,
               "the gateway processes to end")
    stopped = [ln for ln in group.lines() if ln.get("message") == "stopped"]
    assert len(stopped) == 2, group.log()  # each drained on its SIGTERM


def test_without_redis_url_all_processes_share_one_embedded_redis(chaos: ChaosEnv) -> None:
    group = Supervised(chaos, 2).start(redis=["--embedded-dir", str(chaos.dir / "embedded")])
    assert len(group.children("redis-server")) == 1
    assert len(group.children("python")) == 2
    ids = enqueue_over_connections(group.target, connections=8, per_connection=1)
    with grpc.insecure_channel(group.target) as ch:  # every task is in the one Redis
        stub = dtq_pb2_grpc.BrokerStub(ch)
        for task_id in ids:
            reply = stub.GetTask(dtq_pb2.GetTaskRequest(task_id=task_id), timeout=10)
            assert reply.task.task_id == task_id


def test_port_held_by_another_program_is_a_clear_error(chaos: ChaosEnv) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        group = Supervised(chaos, 2, port=port).spawn_group()
        assert group.proc is not None and group.proc.wait(timeout=20) == 1
    errors = [ln["message"] for ln in group.lines() if ln.get("level") == "ERROR"]
    expected = f"gateway failed: gRPC cannot listen on 127.0.0.1:{port}: Address already in use"
    assert errors == [expected], group.log()
    assert not group.listening()


def test_three_processes_elect_exactly_one_scheduler_leader(chaos: ChaosEnv) -> None:
    group = Supervised(chaos, 3).start()
    holder = wait_until(lambda: chaos.rds.get(keys.SCHEDULER_LOCK), 15, "a scheduler leader")
    leader_id = holder.rpartition(":")[0]
    assert leader_id in {f"{GATEWAY_ID}-{i}" for i in range(3)}
    gauges = wait_until(
        lambda: (g := [group.metric(i, "dtq_scheduler_leader") for i in range(3)])
        and sum(g) == 1 and g, 15, "one process to report leading")
    assert gauges[int(leader_id.rpartition("-")[2])] == 1
