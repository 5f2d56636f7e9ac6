"""``python -m bench.scale``: dtq's cost per task on one Redis, G gateways × W workers.

One private redis-server (AOF off, no RDB saves, configured as docs/operations.md
recommends) serves the whole run. For each cell ``GxW`` of ``--matrix`` the bench
flushes Redis, starts G ``dtq-gateway`` processes (own port each, metrics off) and W
``dtq-pyworker`` processes (async no-op handler, spread over the gateways round-robin,
leasing all ``--queues``), then measures two phases:

- **enqueue**: ``--tasks`` tasks of a 100-byte JSON payload sent with ``EnqueueBatch``
  (500 per call, spread evenly over the K queues, one caller per gateway); the workers
  are started but held at a gate, so they lease nothing yet;
- **drain**: the workers are released (SIGUSR1) and the phase ends when their no-op
  handlers have counted every task.

Per phase and for both together ("all"): tasks/s; Redis CPU per task (µs, ``INFO cpu``
used_cpu_user + used_cpu_sys: everything Redis did, scripts included); Redis cores
(Redis CPU s ÷ wall s); gateway and worker CPU per task (µs, utime + stime from
``/proc`` of every process the bench started); Redis calls per task from ``INFO
commandstats`` (``CONFIG RESETSTAT`` before each phase), per command too.

Taskiq (taskiq-redis ``RedisStreamBroker``, from ``bench/.peers-venv``) runs beside
it on the same Redis, flushed in between, once per distinct W: the same backlog and
payload enqueued with ``kiq`` (16 in flight; Taskiq has no batch call), W worker
processes. It prints a table and the one-Redis ceiling (1 s ÷ Redis CPU per task),
writes ``bench/results/scale-<UTC time>.json`` and plots ``docs/img/scale.png``.
See bench/README.md for every column.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from bench import scale_probe
from bench.common import CLK_TCK, REPO, private_redis
from bench.dtq_scale import PAYLOAD_100

logger = logging.getLogger("bench.scale")
BATCH = 500  # items per EnqueueBatch call
TASKIQ_IN_FLIGHT = 16  # kiq calls in flight while Taskiq's backlog is enqueued
TASKIQ_GRACE_S = 2.0  # SIGTERM → SIGKILL of a Taskiq worker process (s)
#: commandstats lines that are script invocations; the commands a script runs are
#: counted on their own lines as well
SCRIPT_COMMANDS = frozenset({"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"})
#: the bench's own calls (INFO, CONFIG RESETSTAT), left out of the per-task counts
OWN_COMMANDS = ("info", "config")
PEERS_PYTHON = REPO / "bench" / ".peers-venv" / "bin" / "python"


class BenchError(RuntimeError):
    """A process of the bench failed or a bounded wait ran out (message says which)."""


# -- command line ------------------------------------------------------------------------
def parse_matrix(text: str) -> list[tuple[int, int]]:
    """``"1x1,2x4"`` → ``[(1, 1), (2, 4)]`` (gateways, worker processes).

    Raises:
        ValueError: a cell is not ``GxW`` with G, W ≥ 1.
    """
    cells = []
    for part in text.split(","):
        g, sep, w = part.strip().lower().replace("×", "x").partition("x")
        if not sep or not g.isdigit() or not w.isdigit() or int(g) < 1 or int(w) < 1:
            raise ValueError(f"matrix cell {part!r} is not GxW (e.g. 2x4)")
        cells.append((int(g), int(w)))
    return cells


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options of ``python -m bench.scale``."""
    p = argparse.ArgumentParser(prog="python -m bench.scale",
                                description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--matrix", default="1x1,1x2,2x2",
                   help="cells GxW: G gateways × W worker processes, comma separated")
    p.add_argument("--tasks", type=int, default=5000, help="backlog size per cell (tasks)")
    p.add_argument("--queues", type=int, default=1,
                   help="K queues: tasks spread evenly, every worker leases all K "
                        "(dtq only; Taskiq uses one stream)")
    p.add_argument("--concurrency", type=int, default=32,
                   help="handler slots per dtq worker process (Taskiq: max-async-tasks 100)")
    p.add_argument("--skip-taskiq", action="store_true", help="measure dtq only")
    p.add_argument("--phase-timeout", type=float, default=300.0,
                   help="longest wait for one phase (enqueue or drain) of one cell (s)")
    p.add_argument("--out", default=str(REPO / "bench" / "results"),
                   help="directory for the JSON result")
    p.add_argument("--json", default=None,
                   help="write the JSON result to this file instead (bench.plot_cpu reads it)")
    p.add_argument("--plot", default=str(REPO / "docs" / "img" / "scale.png"),
                   help="PNG to write (needs matplotlib: pip install '.[bench]')")
    p.add_argument("--no-plot", action="store_true", help="write no PNG")
    p.add_argument("--keep-logs", action="store_true",
                   help="keep the processes' logs (kept anyway when something failed)")
    args = p.parse_args(argv)
    try:
        args.matrix = parse_matrix(args.matrix)
    except ValueError as exc:
        p.error(str(exc))
    if args.tasks < 1 or args.queues < 1 or args.concurrency < 1:
        p.error("--tasks, --queues and --concurrency must be >= 1")
    return args


# -- processes -----------------------------------------------------------------------------
def group_cpu_s(pgids: list[int]) -> float:
    """User + system CPU (s) of every live process in the process groups ``pgids``.

    Each process the bench starts leads its own group (``start_new_session``), so
    this includes any children it forked (Linux ``/proc``).
    """
    wanted = set(pgids)
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[2]) in wanted:
            total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


@dataclass
class Procs:
    """The subprocesses of one cell; logs in ``log_dir``; :meth:`stop_all` ends them."""

    log_dir: Path
    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    grace_s: dict[int, float] = field(default_factory=dict)

    def spawn(self, name: str, cmd: list[str], env: dict[str, str],
              grace_s: float = 10.0) -> subprocess.Popen[bytes]:
        """Start ``cmd`` in its own session, stdout and stderr to ``<name>.log``.

        Args:
            name: log file stem and name in error messages.
            cmd: the command line.
            env: variables added to this process's environment.
            grace_s: how long :meth:`stop_all` waits after SIGTERM before SIGKILL (s).
        """
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{name}.log", "ab") as log:  # the child keeps its copy
            proc = subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ, **env), stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((name, proc))
        self.grace_s[proc.pid] = grace_s
        return proc

    def check_alive(self) -> None:
        """Raise BenchError naming the first process that exited, with its log tail."""
        for name, proc in self.procs:
            if proc.poll() is not None:
                raise BenchError(f"{name} exited with {proc.returncode}: {self.log_tail(name)}")

    def log_tail(self, name: str) -> str:
        """Last lines of a process log."""
        path = self.log_dir / f"{name}.log"
        lines = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
        return " | ".join(lines[-3:])[-400:]

    def stop_all(self) -> None:
        """SIGTERM every process group (last started first), SIGKILL each one still
        there after its grace period; never raises."""
        live = [p for _, p in reversed(self.procs) if p.poll() is None]
        for proc in live:
            _signal_group(proc, signal.SIGTERM)
        t0 = time.monotonic()
        for proc in live:
            try:
                proc.wait(timeout=max(0.1, t0 + self.grace_s[proc.pid] - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    logger.error("process %d did not die", proc.pid)
        self.procs.clear()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_until(cond: Any, procs: Procs, timeout_s: float, what: str,
                interval_s: float = 0.01) -> None:
    """Poll ``cond()`` until true; BenchError when a process dies or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        procs.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(f"{what} did not happen within {timeout_s:.0f} s "
                             f"(logs in {procs.log_dir})")
        time.sleep(interval_s)


# -- measurement ---------------------------------------------------------------------------
def redis_cpu_s(r: redis.Redis) -> float:
    """Redis CPU so far (s): ``INFO cpu`` used_cpu_user + used_cpu_sys."""
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def node_commands(r: redis.Redis) -> dict[str, list[int]]:
    """``INFO commandstats`` of one server as ``{command: [calls, usec]}``, without the
    bench's own commands and without commands never called since the last reset."""
    commands = {k.removeprefix("cmdstat_"): [int(v["calls"]), int(v["usec"])]
                for k, v in r.info("commandstats").items()}
    return {k: v for k, v in commands.items() if not k.startswith(OWN_COMMANDS) and v[0]}


@dataclass
class Meter:
    """Measures one phase: wall time, Redis / gateway / worker CPU and Redis calls.

    With ``nodes`` (the primaries of a cluster, keyed ``host:port``) the Redis figures
    are read on every node and summed; the raw totals then also hold
    ``redis_cpu_s_per_node`` and ``redis_calls_per_node``. Without, ``r`` alone.
    """

    r: redis.Redis
    gateway_pgids: list[int]
    worker_pgids: list[int]
    nodes: dict[str, redis.Redis] | None = None
    start: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    start_per_node: dict[str, float] = field(default_factory=dict)

    def _servers(self) -> dict[str, redis.Redis]:
        return self.nodes or {"": self.r}

    def begin(self) -> None:
        """``CONFIG RESETSTAT`` (on every node), then take the starting readings."""
        for node in self._servers().values():
            node.config_resetstat()
        self.start_per_node = {k: redis_cpu_s(n) for k, n in self._servers().items()}
        self.start = (time.monotonic(), sum(self.start_per_node.values()),
                      group_cpu_s(self.gateway_pgids), group_cpu_s(self.worker_pgids))

    def end(self) -> dict[str, Any]:
        """Raw totals since :meth:`begin`: seconds and ``{command: [calls, usec]}``."""
        t1 = time.monotonic()
        gw1, wk1 = group_cpu_s(self.gateway_pgids), group_cpu_s(self.worker_pgids)
        cpu1 = {k: redis_cpu_s(n) for k, n in self._servers().items()}
        per_node = {k: node_commands(n) for k, n in self._servers().items()}
        t0, rc0, gw0, wk0 = self.start
        commands: dict[str, list[int]] = {}
        for cmds in per_node.values():
            for name, (calls, usec) in cmds.items():
                acc = commands.setdefault(name, [0, 0])
                acc[0] += calls
                acc[1] += usec
        raw = {"wall_s": t1 - t0, "redis_cpu_s": sum(cpu1.values()) - rc0,
               "gateway_cpu_s": gw1 - gw0, "worker_cpu_s": wk1 - wk0, "commands": commands}
        if self.nodes:
            raw["redis_cpu_s_per_node"] = {k: cpu1[k] - self.start_per_node[k] for k in cpu1}
            raw["redis_calls_per_node"] = {k: sum(c for c, _ in cmds.values())
                                           for k, cmds in per_node.items()}
        return raw


def derive(raw: dict[str, Any], tasks: int) -> dict[str, Any]:
    """Per-task figures of one phase from :meth:`Meter.end`'s raw totals.

    Args:
        raw: wall_s, redis_cpu_s, gateway_cpu_s, worker_cpu_s (s) and commands
            ``{name: [calls, usec]}``.
        tasks: tasks the phase moved.

    Returns:
        tasks_per_s; redis_cores (Redis CPU s per wall s); *_cpu_us_per_task (µs);
        redis_calls_per_task_all (every commandstats line: script invocations, the
        commands scripts ran and direct commands), redis_calls_per_task_no_scripts
        (without the EVAL/EVALSHA/FCALL lines: the data commands, inside scripts or
        not), redis_script_calls_per_task, and per command calls_per_task and
        usec_per_task (a script's usec includes the usec of the commands it ran).
    """
    cmds = raw["commands"]
    calls_all = sum(c for c, _ in cmds.values())
    scripts = sum(c for name, (c, _) in cmds.items() if name in SCRIPT_COMMANDS)
    wall = max(raw["wall_s"], 1e-9)
    return {
        "tasks": tasks, "wall_s": round(raw["wall_s"], 3),
        "tasks_per_s": round(tasks / wall, 1),
        "redis_cores": round(raw["redis_cpu_s"] / wall, 3),
        "redis_cpu_us_per_task": round(raw["redis_cpu_s"] / tasks * 1e6, 2),
        "gateway_cpu_us_per_task": round(raw["gateway_cpu_s"] / tasks * 1e6, 1),
        "worker_cpu_us_per_task": round(raw["worker_cpu_s"] / tasks * 1e6, 1),
        "redis_calls_per_task_all": round(calls_all / tasks, 3),
        "redis_calls_per_task_no_scripts": round((calls_all - scripts) / tasks, 3),
        "redis_script_calls_per_task": round(scripts / tasks, 3),
        "commands": {name: {"calls_per_task": round(c / tasks, 4),
                            "usec_per_task": round(u / tasks, 3)}
                     for name, (c, u) in sorted(cmds.items(), key=lambda kv: -kv[1][1])},
        "raw": {k: (round(v, 6) if isinstance(v, float) else v) for k, v in raw.items()},
    }


def combine(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Raw totals of two phases added together (for the "all" figures)."""
    cmds: dict[str, list[int]] = {}
    for raw in (a, b):
        for name, (calls, usec) in raw["commands"].items():
            acc = cmds.setdefault(name, [0, 0])
            acc[0] += calls
            acc[1] += usec
    out = {k: a[k] + b[k] for k in ("wall_s", "redis_cpu_s", "gateway_cpu_s", "worker_cpu_s")}
    out["commands"] = cmds
    for key in ("redis_cpu_s_per_node", "redis_calls_per_node"):  # cluster runs only
        if key in a:
            out[key] = {node: a[key][node] + b[key][node] for node in a[key]}
    return out


# -- one cell ------------------------------------------------------------------------------
@dataclass
class Cell:
    """What one cell shares with its phases: Redis, options, processes, worker files."""

    r: redis.Redis
    redis_url: str
    args: argparse.Namespace
    procs: Procs
    work: Path
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    counters: list[Path] = field(default_factory=list)
    #: variables added to every gateway's environment (``DTQ_REDIS_MODE`` for a cluster)
    gateway_env: dict[str, str] = field(default_factory=dict)
    #: a cluster's primaries (``host:port`` → client): flushed and measured node by node
    nodes: dict[str, redis.Redis] | None = None

    def flush(self) -> None:
        """``FLUSHALL`` on the server, or on every primary of a cluster."""
        for node in (self.nodes or {"": self.r}).values():
            node.flushall()

    def start_worker(self, i: int, cmd: list[str], env: dict[str, str],
                     grace_s: float = 10.0) -> None:
        """Start gated worker ``i`` with its counter and ready files."""
        counter, ready = self.work / f"worker-{i}.count", self.work / f"worker-{i}.ready"
        scale_probe.create(counter)
        env = dict(env, BENCH_SCALE_COUNTER=str(counter), BENCH_SCALE_READY=str(ready),
                   PYTHONPATH=str(REPO))
        self.workers.append(self.procs.spawn(f"worker-{i}", cmd, env, grace_s))
        self.counters.append(counter)

    def wait_workers_ready(self) -> None:
        """Every worker process imported and waiting at the gate (60 s at most)."""
        n = len(self.workers)
        _wait_until(lambda: all((self.work / f"worker-{i}.ready").exists() for i in range(n)),
                    self.procs, 60, f"{n} worker process(es) ready")

    def drain(self, meter: Meter) -> dict[str, Any]:
        """Release the workers; raw totals once every task has been handled."""
        n = self.args.tasks
        meter.begin()
        for proc in self.workers:
            os.kill(proc.pid, scale_probe.GO_SIGNAL)
        _wait_until(lambda: self.handled()[0] >= n, self.procs, self.args.phase_timeout,
                    f"drain of {n} tasks (handled {self.handled()[0]})")
        raw = meter.end()
        count, first, last = self.handled()
        raw["handled"] = count
        raw["handler_span_s"] = (last - first) / 1e9
        return raw

    def handled(self) -> tuple[int, int, int]:
        """Tasks handled by all workers, first and last handler time (monotonic ns)."""
        reads = [scale_probe.read(c) for c in self.counters]
        started = [r for r in reads if r[0]]
        if not started:
            return 0, 0, 0
        return (sum(r[0] for r in reads), min(r[1] for r in started),
                max(r[2] for r in started))


def _phases(enq: dict[str, Any], drain: dict[str, Any], tasks: int) -> dict[str, Any]:
    out = {"enqueue": derive(enq, tasks), "drain": derive(drain, tasks),
           "all": derive(combine(enq, drain), tasks)}
    out["drain"]["handled"] = drain["handled"]  # > tasks: some were delivered twice
    span = drain["handler_span_s"]
    out["drain"]["handler_span_per_s"] = round((tasks - 1) / span, 1) if span > 0 else None
    return out


def queue_names(k: int) -> list[str]:
    """The queues of a run: ``scale`` alone, or ``scale-0`` … ``scale-<k-1>``."""
    return ["scale"] if k == 1 else [f"scale-{i}" for i in range(k)]


def cell_queues(args: argparse.Namespace) -> list[str]:
    """The queues of a cell: ``args.queue_list`` where a caller chose the names
    (``bench.cluster_scale --balanced``), else :func:`queue_names` of ``--queues``."""
    return list(getattr(args, "queue_list", None) or queue_names(args.queues))


def enqueue_plan(tasks: int, queues: list[str]) -> list[tuple[str, int]]:
    """``(queue, items)`` EnqueueBatch calls: tasks split evenly over the queues, ≤ 500
    per call, queues interleaved."""
    k = len(queues)
    per_queue = [tasks // k + (1 if i < tasks % k else 0) for i in range(k)]
    chunks = [[(q, min(BATCH, n - s)) for s in range(0, n, BATCH)]
              for q, n in zip(queues, per_queue)]
    plan = []
    for j in range(max((len(c) for c in chunks), default=0)):
        plan.extend(c[j] for c in chunks if j < len(c))
    return plan


async def _enqueue_dtq(targets: list[str], plan: list[tuple[str, int]], meter: Meter,
                       timeout_s: float) -> dict[str, Any]:
    """Send ``plan`` with one caller per gateway (call j → gateway j mod G); raw totals."""
    import grpc

    from dtq_proto import dtq_pb2, dtq_pb2_grpc

    item = {q: dtq_pb2.EnqueueRequest(queue=q, task_type="noop", payload=PAYLOAD_100,
                                      content_type="application/json") for q, _ in plan}
    requests = [dtq_pb2.EnqueueBatchRequest(items=[item[q]] * n) for q, n in plan]
    channels = [grpc.aio.insecure_channel(t) for t in targets]
    try:
        await asyncio.wait_for(asyncio.gather(*(c.channel_ready() for c in channels)), 30)
        stubs = [dtq_pb2_grpc.BrokerStub(c) for c in channels]

        async def caller(g: int) -> None:
            for req in requests[g::len(stubs)]:
                reply = await stubs[g].EnqueueBatch(req, timeout=60)
                errors = [r.error for r in reply.results if r.HasField("error")]
                if errors:
                    raise BenchError(f"EnqueueBatch: {len(errors)} item(s) failed, first: "
                                     f"{errors[0]}")
        meter.begin()
        await asyncio.wait_for(asyncio.gather(*(caller(g) for g in range(len(stubs)))),
                               timeout_s)
        return meter.end()
    finally:
        await asyncio.gather(*(c.close() for c in channels))


def run_dtq_cell(cell: Cell, gateways: int, workers: int) -> dict[str, Any]:
    """One dtq cell: G gateways, W gated workers, enqueue phase, drain phase.

    Args:
        cell: the cell's Redis client, options, processes and work directory.
        gateways: G, ``dtq-gateway`` processes.
        workers: W, ``dtq-pyworker`` processes (worker i connects to gateway i mod G).

    Returns:
        ``{"system", "gateways", "workers", "queues", "concurrency", "enqueue", "drain",
        "all"}``, the last three as :func:`derive` returns them.

    Raises:
        BenchError: a process exited, or a start-up or phase wait ran out.
    """
    from tests.support.redis_server import free_port

    args, procs = cell.args, cell.procs
    bin_dir = Path(sys.executable).parent
    level = os.environ.get("BENCH_DTQ_LOG_LEVEL", "WARNING")
    targets, gw_procs = [], []
    for g in range(gateways):
        target = f"127.0.0.1:{free_port()}"
        targets.append(target)
        gw_procs.append(procs.spawn(f"gateway-{g}", [
            str(bin_dir / "dtq-gateway"), "--listen", target, "--metrics-port", "0",
            "--log-level", level, "--log-format", "text"],
            {"DTQ_REDIS_URL": cell.redis_url, "PYTHONPATH": str(REPO), **cell.gateway_env}))
    _wait_gateways(targets, procs)
    queues = cell_queues(args)
    for i in range(workers):
        cell.start_worker(i, [
            str(bin_dir / "dtq-pyworker"), "bench.scale_worker:make_worker",
            "--target", targets[i % gateways], "--queues", ",".join(queues),
            "--concurrency", str(args.concurrency), "--log-level", "WARNING"], {})
    cell.wait_workers_ready()
    meter = Meter(cell.r, [p.pid for p in gw_procs], [p.pid for p in cell.workers],
                  nodes=cell.nodes)
    try:
        enq = asyncio.run(_enqueue_dtq(targets, enqueue_plan(args.tasks, queues), meter,
                                       args.phase_timeout))
    except TimeoutError:
        raise BenchError(f"enqueue of {args.tasks} tasks took over {args.phase_timeout:.0f} s "
                         f"(logs in {procs.log_dir})") from None
    drain = cell.drain(meter)
    return {"system": "dtq", "gateways": gateways, "workers": workers, "queues": len(queues),
            "concurrency": args.concurrency, **_phases(enq, drain, args.tasks)}


def _wait_gateways(targets: list[str], procs: Procs) -> None:
    """Every gateway answers gRPC (30 s at most each)."""
    import grpc

    for target in targets:
        with grpc.insecure_channel(target) as channel:
            ready = grpc.channel_ready_future(channel)
            _wait_until(ready.done, procs, 30, f"gateway {target} ready", interval_s=0.05)


def run_taskiq_cell(cell: Cell, workers: int) -> dict[str, Any]:
    """Taskiq with W gated worker processes: kiq enqueue phase, then drain phase.

    Args:
        cell: the cell's Redis client, options, processes and work directory.
        workers: W, Taskiq worker processes.

    Returns:
        As :func:`run_dtq_cell`, with ``gateways`` 0.

    Raises:
        BenchError: a process exited, or a start-up or phase wait ran out.
    """
    args, procs = cell.args, cell.procs
    env = {"BENCH_REDIS_URL": cell.redis_url, "PYTHONPATH": str(REPO)}
    module = [str(PEERS_PYTHON), "-m", "bench.peers.taskiq_scale"]
    ready, done = cell.work / "enqueue.ready", cell.work / "enqueue.done"
    enqueuer = procs.spawn("enqueue", [*module, "enqueue", "--tasks", str(args.tasks),
                                       "--in-flight", str(TASKIQ_IN_FLIGHT)],
                           dict(env, BENCH_SCALE_READY=str(ready), BENCH_SCALE_DONE=str(done)))
    for i in range(workers):
        # Taskiq's worker loop stops prefetching on SIGTERM but does not exit (seen with
        # taskiq 0.13.0): a short grace, then SIGKILL; its figures were taken by then.
        cell.start_worker(i, [*module, "worker"], env, grace_s=TASKIQ_GRACE_S)
    cell.wait_workers_ready()
    _wait_until(ready.exists, procs, 60, "Taskiq enqueuer ready")
    meter = Meter(cell.r, [], [p.pid for p in cell.workers])
    meter.begin()
    os.kill(enqueuer.pid, scale_probe.GO_SIGNAL)
    deadline = time.monotonic() + args.phase_timeout
    while not done.exists():
        if enqueuer.poll() is not None and not done.exists():
            raise BenchError(f"Taskiq enqueuer exited with {enqueuer.returncode}: "
                             f"{procs.log_tail('enqueue')}")
        if time.monotonic() > deadline:
            raise BenchError(f"Taskiq enqueue took over {args.phase_timeout:.0f} s")
        time.sleep(0.01)
    enq = meter.end()
    enqueuer.wait(timeout=30)
    procs.procs = [(n, p) for n, p in procs.procs if p is not enqueuer]
    drain = cell.drain(meter)
    return {"system": "taskiq", "gateways": 0, "workers": workers, "queues": 1,
            "concurrency": 100, **_phases(enq, drain, args.tasks)}


def run_cell(name: str, server_url: str, r: redis.Redis, args: argparse.Namespace,
              work: Path, fn: Any, *fn_args: Any, gateway_env: dict[str, str] | None = None,
              nodes: dict[str, redis.Redis] | None = None) -> dict[str, Any]:
    """Flush Redis, run one cell, stop its processes; ``{"na": reason}`` on failure.

    ``gateway_env`` and ``nodes`` go to :class:`Cell` (a cluster run sets both).
    """
    cell_dir = work / name
    cell_dir.mkdir(parents=True)
    procs = Procs(cell_dir)
    cell = Cell(r, server_url, args, procs, cell_dir, gateway_env=dict(gateway_env or {}),
                nodes=nodes)
    cell.flush()
    logger.warning("%s ...", name)
    try:
        return fn(cell, *fn_args)
    except BenchError as exc:
        logger.error("%s failed: %s", name, exc)
        args.keep_logs = True
        return {"na": str(exc)}
    finally:
        procs.stop_all()


# -- the run -------------------------------------------------------------------------------
def host_info(r: redis.Redis) -> dict[str, Any]:
    import grpc

    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True,
                                  timeout=10, check=False).stdout.strip()
        except OSError:
            return ""
    return {"python": platform.python_version(), "cpus": os.cpu_count(),
            "platform": platform.platform(), "grpcio": grpc.__version__,
            "redis_py": redis.__version__, "redis_server": r.info("server")["redis_version"],
            "commit": git("rev-parse", "--short", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def _taskiq_unavailable() -> str | None:
    """None when Taskiq can run from bench/.peers-venv (installed on first use)."""
    try:
        from bench.peers.orchestrate import ensure_python_peers

        ensure_python_peers()
    except Exception as exc:  # noqa: BLE001 - any install failure means "not available"
        return f"peers venv: {type(exc).__name__}: {exc}"
    probe = subprocess.run([str(PEERS_PYTHON), "-c", "import taskiq, taskiq_redis"],
                           capture_output=True, text=True, timeout=120, check=False)
    return None if probe.returncode == 0 else f"taskiq import: {probe.stderr.strip()[-200:]}"


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every cell of the matrix, then Taskiq once per distinct W, on one private Redis.

    Args:
        args: the parsed command line.

    Returns:
        The results written as JSON: options, host, dtq and taskiq cells, summary,
        elapsed_s (s).
    """
    started = datetime.now(UTC)
    work = Path(tempfile.mkdtemp(prefix="dtq-scale-"))
    results: dict[str, Any] = {
        "started_at": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "options": {"matrix": [f"{g}x{w}" for g, w in args.matrix], "tasks": args.tasks,
                    "queues": args.queues, "concurrency": args.concurrency,
                    "payload_bytes": len(PAYLOAD_100), "batch": BATCH,
                    "taskiq_in_flight": TASKIQ_IN_FLIGHT},
        "dtq": [], "taskiq": []}
    server = private_redis()
    r = redis.Redis.from_url(server.url)
    t0 = time.monotonic()
    try:
        results["host"] = host_info(r)
        for g, w in args.matrix:
            cell = run_cell(f"dtq-{g}x{w}", server.url, r, args, work, run_dtq_cell, g, w)
            results["dtq"].append({"gateways": g, "workers": w, **cell})
        if not args.skip_taskiq:
            why = _taskiq_unavailable()
            for w in sorted({w for _, w in args.matrix}):
                cell = ({"na": why} if why else
                        run_cell(f"taskiq-x{w}", server.url, r, args, work, run_taskiq_cell, w))
                results["taskiq"].append({"workers": w, **cell})
    finally:
        r.flushall()
        r.close()
        server.cleanup()
        if args.keep_logs:
            logger.warning("process logs kept in %s", work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    results["elapsed_s"] = round(time.monotonic() - t0, 1)
    results["summary"] = summarize(results)
    return results


def _taskiq_for(results: dict[str, Any], workers: int) -> dict[str, Any] | None:
    for row in results["taskiq"]:
        if row["workers"] == workers and "na" not in row:
            return row
    return None


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Per-cell one-Redis ceilings and dtq/Taskiq Redis CPU ratios, and their medians.

    The ceiling is 1 s ÷ Redis CPU per task over the whole task life (enqueue +
    drain), in tasks/s: what one fully busy Redis core would carry.
    """
    cells = []
    for row in results["dtq"]:
        if "na" in row:
            continue
        us = row["all"]["redis_cpu_us_per_task"]
        cell = {"cell": f"{row['gateways']}x{row['workers']}", "dtq_redis_us_per_task": us,
                "dtq_ceiling_per_s": round(1e6 / us) if us > 0 else None}
        peer = _taskiq_for(results, row["workers"])
        if peer:
            tus = peer["all"]["redis_cpu_us_per_task"]
            cell.update({"taskiq_redis_us_per_task": tus,
                         "taskiq_ceiling_per_s": round(1e6 / tus) if tus > 0 else None,
                         "ratio_redis_us_dtq_over_taskiq": round(us / tus, 2) if tus else None})
        cells.append(cell)
    out: dict[str, Any] = {"cells": cells}
    for key in ("dtq_redis_us_per_task", "taskiq_redis_us_per_task"):
        values = [c[key] for c in cells if c.get(key)]
        if values:
            med = statistics.median(values)
            out[f"median_{key}"] = round(med, 2)
            out[f"median_{key.split('_')[0]}_ceiling_per_s"] = round(1e6 / med)
    if out.get("median_taskiq_redis_us_per_task"):
        out["median_ratio_dtq_over_taskiq"] = round(
            out["median_dtq_redis_us_per_task"] / out["median_taskiq_redis_us_per_task"], 2)
    return out


# -- report --------------------------------------------------------------------------------
COLUMNS = [("system", 7), ("GxW", 5), ("enq/s", 7), ("drain/s", 7), ("all/s", 7),
           ("cores e/d", 10), ("Redis µs/task e/d/all", 21), ("calls/task", 10),
           ("+scripts", 8), ("gw µs", 7), ("wrk µs", 7), ("ceiling/s", 9)]


def _row(row: dict[str, Any], system: str) -> str:
    label = f"{row['gateways']}x{row['workers']}" if system == "dtq" else f"×{row['workers']}"
    if "na" in row:
        return f"{system:<7} {label:>5}  n/a ({row['na'][:150]})"
    e, d, a = row["enqueue"], row["drain"], row["all"]
    us = a["redis_cpu_us_per_task"]
    cells = [system, label, f"{e['tasks_per_s']:,.0f}", f"{d['tasks_per_s']:,.0f}",
             f"{a['tasks_per_s']:,.0f}", f"{e['redis_cores']:.2f}/{d['redis_cores']:.2f}",
             f"{e['redis_cpu_us_per_task']:.1f}/{d['redis_cpu_us_per_task']:.1f}/{us:.1f}",
             f"{a['redis_calls_per_task_no_scripts']:.2f}",
             f"{a['redis_script_calls_per_task']:.2f}",
             f"{a['gateway_cpu_us_per_task']:.0f}" if system == "dtq" else "–",
             f"{a['worker_cpu_us_per_task']:.0f}", f"{1e6 / us:,.0f}" if us > 0 else "–"]
    return " ".join(f"{c:>{w}}" if i > 0 else f"{c:<{w}}"
                    for i, (c, (_, w)) in enumerate(zip(cells, COLUMNS)))


def render(results: dict[str, Any]) -> str:
    """The printed report: one row per cell and per Taskiq run, then the ceilings."""
    opts = results["options"]
    head = (f"dtq scale: {opts['tasks']:,} tasks of {opts['payload_bytes']} B per cell, "
            f"{opts['queues']} queue(s), one redis-server {results['host']['redis_server']}, "
            f"{results['host']['cpus']} CPUs, commit {results['host']['commit']}")
    lines = [head, " ".join(f"{n:>{w}}" if i else f"{n:<{w}}" for i, (n, w) in enumerate(COLUMNS))]
    lines += [_row(row, "dtq") for row in results["dtq"]]
    lines += [_row(row, "taskiq") for row in results["taskiq"]]
    lines.append("")
    for c in results["summary"]["cells"]:
        line = (f"{c['cell']:>5}: one-Redis ceiling dtq {c['dtq_ceiling_per_s']:,}/s "
                f"({c['dtq_redis_us_per_task']:.1f} µs/task)")
        if "taskiq_redis_us_per_task" in c:
            line += (f", Taskiq ×{c['cell'].split('x')[1]} {c['taskiq_ceiling_per_s']:,}/s "
                     f"({c['taskiq_redis_us_per_task']:.1f} µs/task); dtq/Taskiq Redis CPU "
                     f"per task {c['ratio_redis_us_dtq_over_taskiq']:.2f}×")
        lines.append(line)
    s = results["summary"]
    if "median_ratio_dtq_over_taskiq" in s:
        lines.append(f"median over cells: dtq {s['median_dtq_redis_us_per_task']:.1f} µs/task "
                     f"(ceiling {s['median_dtq_ceiling_per_s']:,}/s), Taskiq "
                     f"{s['median_taskiq_redis_us_per_task']:.1f} µs/task (ceiling "
                     f"{s['median_taskiq_ceiling_per_s']:,}/s), ratio "
                     f"{s['median_ratio_dtq_over_taskiq']:.2f}×")
    lines.append("e/d/all: enqueue phase / drain phase / both; calls/task: Redis commands "
                 "per task without the EVAL/EVALSHA lines (commands run inside scripts "
                 "included); +scripts: script calls per task on top; gw, wrk: gateway and "
                 "worker CPU µs per task (all); ceiling: 1 s ÷ Redis µs/task (all)")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> bool:
    """Draw tasks/s and Redis CPU per task (µs) against the cells, as a PNG.

    Args:
        results: what :func:`run` returned.
        path: the PNG to write (its directory is created).

    Returns:
        False when matplotlib is missing or no dtq cell succeeded, else True.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib missing: no plot (pip install '.[bench]')")
        return False
    rows = [r for r in results["dtq"] if "na" not in r]
    if not rows:
        return False
    labels = [f"{r['gateways']}×{r['workers']}" for r in rows]
    x = list(range(len(rows)))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    top.plot(x, [r["drain"]["tasks_per_s"] for r in rows], "o-", label="dtq drain")
    top.plot(x, [r["all"]["tasks_per_s"] for r in rows], "s-",
             label="dtq enqueue + drain")
    peers = [_taskiq_for(results, r["workers"]) for r in rows]
    if any(peers):
        top.plot(x, [p["drain"]["tasks_per_s"] if p else float("nan") for p in peers], "^--",
                 color="tab:gray", label="Taskiq drain (same W)")
    top.set_ylabel("tasks/s")
    top.set_ylim(bottom=0)
    top.grid(alpha=0.3)
    top.legend(loc="best", fontsize=9)
    top.set_title(f"dtq on one Redis: {results['options']['tasks']:,} tasks per cell, "
                  f"{results['host']['cpus']} CPUs")
    bottom.plot(x, [r["all"]["redis_cpu_us_per_task"] for r in rows], "o-", color="tab:red",
                label="dtq Redis CPU per task (enqueue + drain)")
    bottom.plot(x, [r["drain"]["redis_cpu_us_per_task"] for r in rows], "o:",
                color="tab:orange", label="dtq, drain phase only")
    if any(peers):
        bottom.plot(x, [p["all"]["redis_cpu_us_per_task"] if p else float("nan")
                        for p in peers], "^--", color="tab:gray",
                    label="Taskiq Redis CPU per task (same W)")
    bottom.set_ylabel("Redis CPU per task (µs)")
    bottom.set_ylim(bottom=0)
    bottom.set_xticks(x, labels)
    bottom.set_xlabel("gateways × worker processes")
    bottom.grid(alpha=0.3)
    bottom.legend(loc="best", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the matrix, print the report, write the JSON and the plot."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, raise_interrupt)  # clean up as on Ctrl-C
    try:
        results = run(args)
    except KeyboardInterrupt:
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # cancelled calls' futures
        print("interrupted; every process the bench started was stopped", file=sys.stderr)
        return 130
    print(render(results))
    path = Path(args.json) if args.json else (
        Path(args.out) / f"scale-{results['started_at'].replace(':', '')}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nelapsed {results['elapsed_s']} s; JSON written to {path}")
    if not args.no_plot and plot(results, Path(args.plot)):
        print(f"plot written to {args.plot}")
    return 0 if all("na" not in row for row in results["dtq"]) else 1


if __name__ == "__main__":
    sys.exit(main())
