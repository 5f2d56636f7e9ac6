"""What ``pool="process"`` costs per task, against the thread pool.

Usage::

    python -m bench.process_pool [--tasks 2000] [--calls 2000] [--concurrency 4] [--json PATH]

Two figures per pool, each from a no-op sync handler (:func:`noop`):

* **dispatch**: ``--calls`` handler calls one after another straight through the
  worker's own executor path (``dtq_pyworker._execute.execute``), no gateway: the
  cost of handing a call to a pool thread, or to a child process and back
  (pickling, two pipe round trips), in microseconds per call;
* **end to end**: ``--tasks`` tasks enqueued beforehand (``EnqueueBatch`` of 500) on an
  in-process gateway over a private redis-server, drained by one in-process Worker
  with ``--concurrency`` slots; tasks/s and milliseconds per task. The gateway shares
  the CPU with the worker, as on a small host.

Prints one line per pool and figure, and the process pool's extra cost per task
(process minus thread). ``--json`` also writes them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from bench.common import REPO, private_redis

QUEUE = "pp-bench"
BATCH = 500


def noop(payload: Any, ctx: Any) -> None:
    """The measured handler: does nothing (module-level, so children can import it)."""


async def dispatch_us(pool: str, calls: int) -> float:
    """Mean microseconds per handler call through the pool, no gateway."""
    from concurrent.futures import ThreadPoolExecutor

    from dtq_proto import dtq_pb2
    from dtq_pyworker._execute import Execution, Handler, execute
    from dtq_pyworker._procpool import ProcessPool
    from dtq_pyworker.context import TaskContext

    handler = Handler.wrap(noop)
    executor: Any = (ProcessPool(1, {"noop": handler}, 0.0) if pool == "process"
                     else ThreadPoolExecutor(1))
    if pool == "process":
        await executor.start()

    def one() -> Execution:
        task = dtq_pb2.LeasedTask(task_id="0" * 32, lease_id="l", task_type="noop",
                                  payload=b"{}", content_type="application/json", attempt=1)
        ctx = TaskContext(task_id=task.task_id, queue=QUEUE, task_type="noop", attempt=1,
                          max_attempts=1, metadata={}, timeout_ms=0, worker_id="bench",
                          lease_id="l")
        return Execution(task=task, ctx=ctx)

    try:
        for _ in range(min(50, calls)):  # warm-up
            await execute(handler, one(), executor)
        started = time.perf_counter()
        for _ in range(calls):
            outcome = await execute(handler, one(), executor)
            assert outcome.ack_result is not None, outcome
        return (time.perf_counter() - started) / calls * 1e6
    finally:
        if pool == "process":
            await executor.close()
        else:
            executor.shutdown()


async def end_to_end(pool: str, tasks: int, concurrency: int, redis_url: str) -> dict:
    """Drain ``tasks`` queued no-op tasks with one worker; wall time and rate."""
    from dtq_gateway.server import Gateway
    from dtq_gateway.settings import load
    from dtq_pyworker import AsyncClient, Worker

    settings = load([], environ={"DTQ_REDIS_URL": redis_url, "DTQ_LISTEN": "127.0.0.1:0",
                                 "DTQ_METRICS_PORT": "0", "DTQ_LOG_LEVEL": "WARNING"})
    gateway = Gateway(settings, redis_url)
    await gateway.start()
    target = f"127.0.0.1:{gateway.port}"
    try:
        async with AsyncClient(target) as client:
            for start in range(0, tasks, BATCH):
                n = min(BATCH, tasks - start)
                await client.enqueue_batch([{"queue": QUEUE, "task_type": "noop",
                                             "payload": {}}] * n)
        worker = Worker([QUEUE], target, concurrency=concurrency, pool=pool,
                        worker_id=f"bench-{pool}")
        worker.register("noop", noop)
        run = asyncio.create_task(worker.run_async(install_signal_handlers=False))
        while worker._runtime is None:  # the pool is started before the first lease
            await asyncio.sleep(0.001)
        started = time.perf_counter()
        while worker.stats["processed"] < tasks:
            if run.done():
                run.result()
            await asyncio.sleep(0.002)
        wall_s = time.perf_counter() - started
        worker.stop()
        await run
    finally:
        await gateway.stop()
    return {"tasks": tasks, "wall_s": round(wall_s, 3), "tasks_per_s": round(tasks / wall_s, 1),
            "ms_per_task": round(wall_s / tasks * 1000, 3)}


async def measure(tasks: int, calls: int, concurrency: int) -> dict:
    """Every figure for both pools (one private redis-server, flushed between runs)."""
    import redis

    results: dict[str, Any] = {"concurrency": concurrency}
    for pool in ("thread", "process"):
        results[pool] = {"dispatch_us_per_call": round(await dispatch_us(pool, calls), 1)}
    server = private_redis()
    try:
        for pool in ("thread", "process"):
            redis.Redis.from_url(server.url).flushall()
            results[pool]["end_to_end"] = await end_to_end(pool, tasks, concurrency, server.url)
    finally:
        server.cleanup()
    results["process_extra_us_per_task"] = {
        "dispatch": round(results["process"]["dispatch_us_per_call"]
                          - results["thread"]["dispatch_us_per_call"], 1),
        "end_to_end": round((results["process"]["end_to_end"]["ms_per_task"]
                             - results["thread"]["end_to_end"]["ms_per_task"]) * 1000, 1)}
    return results


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark, print the figures; returns them."""
    p = argparse.ArgumentParser(prog="python -m bench.process_pool", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=2000, help="tasks per end-to-end run")
    p.add_argument("--calls", type=int, default=2000, help="handler calls per dispatch run")
    p.add_argument("--concurrency", type=int, default=4, help="worker slots end to end")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    results = asyncio.run(measure(args.tasks, args.calls, args.concurrency))
    for pool in ("thread", "process"):
        e2e = results[pool]["end_to_end"]
        print(f"{pool:8} dispatch {results[pool]['dispatch_us_per_call']:8.1f} us/call   "
              f"end to end {e2e['tasks_per_s']:8.1f} tasks/s {e2e['ms_per_task']:7.3f} ms/task "
              f"({e2e['tasks']} tasks, concurrency {args.concurrency})")
    extra = results["process_extra_us_per_task"]
    print(f"process pool extra cost: {extra['dispatch']:.1f} us/call dispatch, "
          f"{extra['end_to_end']:.1f} us/task end to end")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2)
    return results


if __name__ == "__main__":
    main()
