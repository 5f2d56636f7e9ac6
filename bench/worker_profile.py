"""Worker CPU per task with a no-op handler, beside the gateway's, and where it goes.

Usage::

    python -m bench.worker_profile [--tasks 20000] [--concurrency 32] [--runs 1]
                                   [--max-batch N] [--cprofile] [--json PATH]

One private redis-server, one gateway process (``python -m dtq_gateway``) and, per run,
one worker process (``dtq_pyworker.Worker``, an ``async def`` handler that does
nothing). ``--tasks`` tasks (100-byte JSON payloads) are enqueued with
``EnqueueBatch`` of 500 before the worker starts, so the worker drains a backlog. The
window runs from the worker's first handler call until the gateway acked every task
(the worker's ``processed`` counter); both processes' CPU (user + system, /proc) over
that window is divided by ``--tasks`` (the worker's also for its event loop's thread
alone: the rest is grpc's own threads). ``--max-batch`` sets the worker's
``LeaseRequest.max_batch`` (default: what the worker asks for itself; 1 = one task per
stream message). ``--cprofile`` also prints the worker's top 20 functions by own CPU time of the
event loop's thread (cProfile adds its own cost: read its CPU figure as inflated).

The figures are noisy on a shared machine: run it with few other processes busy and
compare runs made back to back (``--runs`` repeats and prints each).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

from bench.common import REPO, private_redis, proc_cpu_s, stop_process

QUEUE = "profile"
BATCH = 500
PAYLOAD = {"id": 0, "body": "x" * 80}


async def child(target: str, queue: str, tasks: int, concurrency: int,
                max_batch: int | None, cprofile: bool) -> None:
    """The worker process: drain ``tasks``; print a line at the first handler call and a
    JSON line with its CPU and wall time once every task was acked."""
    from dtq_pyworker import Worker
    from dtq_pyworker._reporter import ResultReporter

    calls: list[int] = []  # items per Ack/Fail call: how well results batch under load
    send = ResultReporter._send

    async def counted_send(self, method, request_cls, items):
        if items:
            calls.append(len(items))
        return await send(self, method, request_cls, items)

    ResultReporter._send = counted_send
    worker = Worker([queue], target, concurrency=concurrency, worker_id="profile-worker")
    if max_batch is not None:
        worker.lease_max_batch = lambda: max_batch  # the bench's override
    first: list[tuple[float, float]] = []
    profiler = None
    if cprofile:
        import cProfile
        profiler = cProfile.Profile(time.thread_time)  # the loop thread's CPU, not waits

    @worker.task("noop")
    async def noop(payload: Any, ctx: Any) -> None:
        if not first:
            first.append((time.process_time(), time.perf_counter(), time.thread_time()))
            print("first", flush=True)
            if profiler is not None:
                profiler.enable()

    run = asyncio.create_task(worker.run_async(install_signal_handlers=False))
    while worker.stats["processed"] < tasks:  # a coarse poll: 50 wake-ups a second
        if run.done():
            run.result()
        await asyncio.sleep(0.02)
    cpu_s, wall_s = time.process_time() - first[0][0], time.perf_counter() - first[0][1]
    loop_cpu_s = time.thread_time() - first[0][2]  # the event loop's thread alone
    if profiler is not None:
        profiler.disable()
    print(json.dumps({"cpu_s": cpu_s, "wall_s": wall_s, "loop_cpu_s": loop_cpu_s,
                      "result_calls": len(calls),
                      "max_batch": worker.session.max_batch if worker.session else 0}),
          flush=True)
    if profiler is not None:
        import pstats
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(20)
    worker.stop()
    await run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_gateway(redis_url: str) -> tuple[subprocess.Popen, str]:
    """A gateway process on a free port, once it answers (within 30 s)."""
    import grpc

    port = _free_port()
    env = {**os.environ, "DTQ_REDIS_URL": redis_url, "DTQ_LISTEN": f"127.0.0.1:{port}",
           "DTQ_METRICS_PORT": "0", "DTQ_LOG_LEVEL": "WARNING", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "dtq_gateway"], cwd=REPO, env=env,
                            start_new_session=True)
    target = f"127.0.0.1:{port}"
    with grpc.insecure_channel(target) as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
    return proc, target


def _enqueue(target: str, queue: str, tasks: int) -> None:
    from dtq_pyworker import Client

    with Client(target) as client:
        for start in range(0, tasks, BATCH):
            n = min(BATCH, tasks - start)
            client.enqueue_batch([{"queue": queue, "task_type": "noop",
                                   "payload": {**PAYLOAD, "id": start + i}} for i in range(n)])


async def _run_worker(args: argparse.Namespace, target: str, queue: str,
                      gateway_pid: int) -> dict:
    """One drain: the worker child's figures and the gateway's CPU over its window."""
    cmd = [sys.executable, "-m", "bench.worker_profile", "--child", "--target", target,
           "--queue", queue, "--tasks", str(args.tasks), "--concurrency", str(args.concurrency)]
    if args.max_batch is not None:
        cmd += ["--max-batch", str(args.max_batch)]
    if args.cprofile:
        cmd.append("--cprofile")
    proc = await asyncio.create_subprocess_exec(
        *cmd, cwd=REPO, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout is not None
    line = await proc.stdout.readline()
    if line.strip() != b"first":
        raise RuntimeError(f"worker child said {line!r}")
    gw_start = proc_cpu_s(gateway_pid)
    line = await proc.stdout.readline()
    gw_cpu_s = proc_cpu_s(gateway_pid) - gw_start
    await proc.wait()
    if proc.returncode != 0 or not line:
        raise RuntimeError(f"worker child exited with {proc.returncode}")
    res = json.loads(line)
    n = args.tasks
    return {"tasks": n, "max_batch": res["max_batch"],
            "worker_cpu_us_per_task": round(res["cpu_s"] / n * 1e6, 1),
            "worker_loop_thread_cpu_us_per_task": round(res["loop_cpu_s"] / n * 1e6, 1),
            "gateway_cpu_us_per_task": round(gw_cpu_s / n * 1e6, 1),
            "tasks_per_s": round(n / res["wall_s"], 1),
            "items_per_result_call": round(n / max(1, res["result_calls"]), 1)}


async def measure(args: argparse.Namespace) -> list[dict]:
    """``--runs`` drains behind one gateway process, each of its own queue."""
    server = private_redis()
    gateway, target = _start_gateway(server.url)
    runs = []
    try:
        for _ in range(args.runs):
            queue = f"{QUEUE}-{len(runs)}"  # a fresh queue per run, no flush under the gateway
            _enqueue(target, queue, args.tasks)
            runs.append(await _run_worker(args, target, queue, gateway.pid))
    finally:
        stop_process(gateway)
        server.cleanup()
    return runs


def main(argv: list[str] | None = None) -> list[dict]:
    """Run the measurement (or, with ``--child``, the worker); print the figures."""
    p = argparse.ArgumentParser(prog="python -m bench.worker_profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=20000, help="tasks per run")
    p.add_argument("--concurrency", type=int, default=32, help="worker handler slots")
    p.add_argument("--max-batch", type=int, default=None,
                   help="LeaseRequest.max_batch (default: the worker's own choice)")
    p.add_argument("--runs", type=int, default=1, help="drains, back to back")
    p.add_argument("--cprofile", action="store_true", help="print the worker's top 20")
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--target", help=argparse.SUPPRESS)
    p.add_argument("--queue", default=QUEUE, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    if args.child:
        asyncio.run(child(args.target, args.queue, args.tasks, args.concurrency,
                          args.max_batch, args.cprofile))
        return []
    runs = asyncio.run(measure(args))
    for r in runs:
        print(f"worker {r['worker_cpu_us_per_task']:7.1f} us/task (event loop thread "
              f"{r['worker_loop_thread_cpu_us_per_task']:.1f})  gateway "
              f"{r['gateway_cpu_us_per_task']:7.1f} us/task  {r['tasks_per_s']:8.1f} tasks/s  "
              f"(max_batch {r['max_batch']}, {r['items_per_result_call']} results per "
              f"Ack call, {r['tasks']} tasks, "
              f"concurrency {args.concurrency})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(runs, fh, indent=2)
    return runs


if __name__ == "__main__":
    main()
