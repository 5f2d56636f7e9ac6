"""``python -m bench.go_worker``: the Go worker's drain beside the Python worker's.

Runs two cells of ``bench.scale`` on one private Redis with the same gateways, backlog
and payload: one with ``dtq-pyworker`` processes (``bench.scale_worker``), one with
the Go worker (``clients/go/bin/dtq-bench-worker``, a no-op handler on the same
counter file and start gate, bench/scale_probe.py). It prints, per worker kind,
the drain phase's tasks/s and the CPU per task (µs) of the workers, the gateways
and Redis, which is what a worker implementation changes. ``make install`` builds
the Go binary where Go is installed (clients/go/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import redis

from bench import scale
from bench.common import REPO, private_redis

GO_BENCH_WORKER = REPO / "clients" / "go" / "bin" / "dtq-bench-worker"


def run_go_cell(cell: scale.Cell, gateways: int, workers: int) -> dict[str, Any]:
    """One cell like :func:`bench.scale.run_dtq_cell`, with W Go worker processes.

    Returns:
        ``{"system": "dtq-go", "gateways", "workers", "queues", "concurrency",
        "enqueue", "drain", "all"}`` as :func:`bench.scale.run_dtq_cell`.

    Raises:
        bench.scale.BenchError: a process exited, or a wait ran out.
    """
    from tests.support.redis_server import free_port

    args, procs = cell.args, cell.procs
    targets, gw_procs = [], []
    for g in range(gateways):
        targets.append(f"127.0.0.1:{free_port()}")
        gw_procs.append(procs.spawn(f"gateway-{g}", [
            str(Path(sys.executable).parent / "dtq-gateway"), "--listen", targets[-1],
            "--metrics-port", "0", "--log-level", "WARNING", "--log-format", "text"],
            {"DTQ_REDIS_URL": cell.redis_url, "PYTHONPATH": str(REPO)}))
    scale._wait_gateways(targets, procs)
    queues = scale.cell_queues(args)
    for i in range(workers):
        cell.start_worker(i, [str(GO_BENCH_WORKER)], {
            "DTQ_GATEWAY": targets[i % gateways], "DTQ_QUEUES": ",".join(queues),
            "DTQ_CONCURRENCY": str(args.concurrency), "DTQ_MAX_BATCH": str(args.max_batch)})
    cell.wait_workers_ready()
    meter = scale.Meter(cell.r, [p.pid for p in gw_procs], [p.pid for p in cell.workers])
    enq = asyncio.run(scale._enqueue_dtq(targets, scale.enqueue_plan(args.tasks, queues),
                                         meter, args.phase_timeout))
    drain = cell.drain(meter)
    return {"system": "dtq-go", "gateways": gateways, "workers": workers,
            "queues": len(queues), "concurrency": args.concurrency,
            **scale._phases(enq, drain, args.tasks)}


def row(name: str, cell: dict[str, Any]) -> str:
    """One printed row: drain tasks/s and CPU µs per task of workers, gateways, Redis."""
    if "na" in cell:
        return f"{name:<10} n/a ({cell['na'][:150]})"
    d = cell["drain"]
    return (f"{name:<10} {d['tasks_per_s']:>9,.0f} {d['worker_cpu_us_per_task']:>9.0f} "
            f"{d['gateway_cpu_us_per_task']:>9.0f} {d['redis_cpu_us_per_task']:>9.1f}")


def main(argv: list[str] | None = None) -> int:
    """Run the Python cell and the Go cell; print both rows. Exit 2 without the Go binary."""
    p = argparse.ArgumentParser(prog="python -m bench.go_worker", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=5000, help="backlog per cell (tasks)")
    p.add_argument("--gateways", type=int, default=1, help="gateway processes")
    p.add_argument("--workers", type=int, default=1, help="worker processes")
    p.add_argument("--concurrency", type=int, default=32, help="handler slots per worker")
    p.add_argument("--max-batch", type=int, default=0,
                   help="LeaseRequest.max_batch of the Go worker (0: one task per message)")
    p.add_argument("--phase-timeout", type=float, default=300.0, help="per phase (s)")
    args = p.parse_args(argv)
    args.queues, args.keep_logs = 1, False
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if not GO_BENCH_WORKER.is_file():
        print(f"{GO_BENCH_WORKER.relative_to(REPO)} missing: make install builds it where Go "
              "is installed")
        return 2
    server = private_redis()
    r = redis.Redis.from_url(server.url)
    work = Path(tempfile.mkdtemp(prefix="dtq-go-bench-"))
    g, w = args.gateways, args.workers
    try:
        py = scale.run_cell("python", server.url, r, args, work, scale.run_dtq_cell, g, w)
        go = scale.run_cell("go", server.url, r, args, work, run_go_cell, g, w)
    finally:
        r.close()
        server.cleanup()
        if not args.keep_logs:
            shutil.rmtree(work, ignore_errors=True)
    print(f"dtq drain, {args.tasks:,} no-op tasks, {g} gateway(s) x {w} worker(s), "
          f"concurrency {args.concurrency}, Go max_batch {args.max_batch}")
    print(f"{'worker':<10} {'drain/s':>9} {'wrk µs':>9} {'gw µs':>9} {'Redis µs':>9}")
    print(row("python", py))
    print(row("go", go))
    print("wrk, gw, Redis: CPU µs per task of the workers, gateways and Redis in the drain")
    return 0 if "na" not in py and "na" not in go else 1


if __name__ == "__main__":
    sys.exit(main())
