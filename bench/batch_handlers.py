"""Worker CPU per task: a batch handler against one handler call per task.

Usage::

    python -m bench.batch_handlers [--tasks 5000] [--max-size 100] [--call-cost-us 0]
                                   [--concurrency 4] [--json PATH]

``--tasks`` tasks are enqueued beforehand (``EnqueueBatch`` of 500) on an in-process
gateway over a private redis-server, then drained by one Worker running in a child
process (so its CPU is its own, not the gateway's), twice:

* **single**: ``Worker.task`` with one call per task;
* **batch**: ``Worker.batch_task(max_size=--max-size, max_wait_ms=50)``, one call per
  batch.

Each handler call costs ``--call-cost-us`` of CPU (a busy loop: the fixed part of a
bulk insert or an API call) plus a JSON encoding of its payloads. The child reports
the CPU time (user + system) it spent from its first lease until every task was acked;
the figure is that over ``--tasks``, in microseconds per task, with the wall time and
the batch sizes seen. ``--json`` also writes them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

from bench.common import REPO, private_redis

QUEUE = "batch-bench"
BATCH = 500


def _spin(us: float) -> None:
    """Burn ``us`` microseconds of CPU (the fixed cost of one handler call)."""
    end = time.thread_time() + us / 1e6
    while time.thread_time() < end:
        pass


async def child(mode: str, target: str, tasks: int, max_size: int, call_cost_us: float,
                concurrency: int) -> dict:
    """Run one worker until ``tasks`` are acked; its CPU and wall time from the first
    handler call."""
    from dtq_pyworker import Worker

    worker = Worker([QUEUE], target, concurrency=concurrency, worker_id=f"bench-{mode}",
                    max_in_flight=max_size + 2 * concurrency if mode == "batch" else None)
    sizes: list[int] = []
    first: list[tuple[float, float]] = []

    def mark() -> None:
        if not first:
            first.append((time.process_time(), time.perf_counter()))

    if mode == "batch":
        @worker.batch_task("work", max_size=max_size, max_wait_ms=50)
        def work_batch(payloads: list, ctxs: list) -> list:
            mark()
            sizes.append(len(payloads))
            json.dumps(payloads)
            _spin(call_cost_us)
            return [None] * len(payloads)
    else:
        @worker.task("work")
        def work(payload: Any, ctx: Any) -> None:
            mark()
            json.dumps([payload])
            _spin(call_cost_us)

    run = asyncio.create_task(worker.run_async(install_signal_handlers=False))
    while worker.stats["processed"] < tasks:
        if run.done():
            run.result()
        await asyncio.sleep(0.005)
    cpu_s, wall_s = time.process_time() - first[0][0], time.perf_counter() - first[0][1]
    worker.stop()
    await run
    return {"mode": mode, "tasks": tasks, "cpu_s": round(cpu_s, 4), "wall_s": round(wall_s, 3),
            "cpu_us_per_task": round(cpu_s / tasks * 1e6, 1),
            "tasks_per_s": round(tasks / wall_s, 1), "calls": len(sizes) if sizes else tasks,
            "mean_batch": round(sum(sizes) / len(sizes), 1) if sizes else 1.0}


async def _gateway_run(mode: str, args: argparse.Namespace, redis_url: str) -> dict:
    """Enqueue the tasks, run the worker child against an in-process gateway."""
    from dtq_gateway.server import Gateway
    from dtq_gateway.settings import load
    from dtq_pyworker import AsyncClient

    settings = load([], environ={"DTQ_REDIS_URL": redis_url, "DTQ_LISTEN": "127.0.0.1:0",
                                 "DTQ_METRICS_PORT": "0", "DTQ_LOG_LEVEL": "WARNING"})
    gateway = Gateway(settings, redis_url)
    await gateway.start()
    target = f"127.0.0.1:{gateway.port}"
    try:
        async with AsyncClient(target) as client:
            for start in range(0, args.tasks, BATCH):
                n = min(BATCH, args.tasks - start)
                await client.enqueue_batch([{"queue": QUEUE, "task_type": "work",
                                             "payload": {"n": start + i}} for i in range(n)])
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.batch_handlers", "--child", mode, "--target", target,
            "--tasks", str(args.tasks), "--max-size", str(args.max_size),
            "--call-cost-us", str(args.call_cost_us), "--concurrency", str(args.concurrency),
            cwd=REPO, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"worker child exited with {proc.returncode}")
        return json.loads(out.decode().strip().splitlines()[-1])
    finally:
        await gateway.stop()


async def measure(args: argparse.Namespace) -> dict:
    """Both modes on one private redis-server, flushed between runs."""
    import redis

    results: dict[str, Any] = {"max_size": args.max_size, "call_cost_us": args.call_cost_us,
                               "concurrency": args.concurrency}
    server = private_redis()
    try:
        for mode in ("single", "batch"):
            redis.Redis.from_url(server.url).flushall()
            results[mode] = await _gateway_run(mode, args, server.url)
    finally:
        server.cleanup()
    results["cpu_ratio_single_over_batch"] = round(
        results["single"]["cpu_us_per_task"] / results["batch"]["cpu_us_per_task"], 2)
    return results


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark (or, with ``--child``, one worker); print the figures."""
    p = argparse.ArgumentParser(prog="python -m bench.batch_handlers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=5000, help="tasks per run")
    p.add_argument("--max-size", type=int, default=100, help="batch handler's max_size")
    p.add_argument("--call-cost-us", type=float, default=0.0,
                   help="CPU each handler call burns, in us (default 0)")
    p.add_argument("--concurrency", type=int, default=4, help="worker slots")
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument("--child", choices=("single", "batch"), help=argparse.SUPPRESS)
    p.add_argument("--target", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    if args.child:
        res = asyncio.run(child(args.child, args.target, args.tasks, args.max_size,
                                args.call_cost_us, args.concurrency))
        print(json.dumps(res), flush=True)
        return res
    results = asyncio.run(measure(args))
    for mode in ("single", "batch"):
        r = results[mode]
        print(f"{mode:6} worker CPU {r['cpu_us_per_task']:8.1f} us/task  "
              f"{r['tasks_per_s']:8.1f} tasks/s  {r['calls']} calls (mean {r['mean_batch']} "
              f"tasks/call; {r['tasks']} tasks, call cost {args.call_cost_us:.0f} us, "
              f"concurrency {args.concurrency})")
    print(f"batch handler: {results['cpu_ratio_single_over_batch']}x less worker CPU per task")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2)
    return results


if __name__ == "__main__":
    main()
