"""Taskiq (taskiq-redis ``RedisStreamBroker``) processes of the scale bench.

Run with ``bench/.peers-venv/bin/python -m bench.peers.taskiq_scale``:

- ``worker``: one Taskiq worker process. It builds the arguments of ``taskiq worker
  bench.peers.taskiq_scale:broker --workers 1`` and runs taskiq's own per-process
  function (``start_listen``, what each ``taskiq worker`` child runs) in this process,
  after the start gate (:func:`bench.scale_probe.wait_for_go`); the async no-op
  handler records each task in ``$BENCH_SCALE_COUNTER``.
- ``enqueue --tasks N --in-flight K``: connects, writes ``$BENCH_SCALE_READY``, waits
  for SIGUSR1, sends N ``kiq`` calls with K in flight (Taskiq has no batch call),
  writes ``$BENCH_SCALE_DONE`` and exits.

The broker reads ``$BENCH_REDIS_URL``; stream ``scale``, consumer group from id 0 so
that the backlog enqueued before the workers start is delivered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

from taskiq_redis import RedisStreamBroker

from bench import scale_probe

STREAM = "scale"
#: the 100-byte JSON payload of the dtq side (bench.dtq_scale.PAYLOAD_100), decoded
PAYLOAD = {"pad": "x" * 90}

broker = RedisStreamBroker(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
                           queue_name=STREAM, consumer_group_name="scale", consumer_id="0")
_counter: scale_probe.Counter | None = None


@broker.task(task_name="noop")
async def noop(p: dict) -> None:
    """No-op task: counts itself."""
    assert _counter is not None
    _counter.hit()


def run_worker(max_async_tasks: int) -> None:
    """Gate, then taskiq's worker loop in this process until SIGTERM."""
    global _counter
    from taskiq.cli.worker.args import WorkerArgs
    from taskiq.cli.worker.run import start_listen

    _counter = scale_probe.Counter(os.environ["BENCH_SCALE_COUNTER"])
    args = WorkerArgs.from_cli(["bench.peers.taskiq_scale:broker", "--workers", "1",
                                "--max-async-tasks", str(max_async_tasks),
                                "--log-level", os.environ.get("BENCH_TASKIQ_LOG_LEVEL", "WARNING")])
    args.broker = broker  # this module's instance (it is __main__ here, not re-imported)
    logging.basicConfig(level=args.log_level, format=args.log_format)  # as `taskiq worker`
    scale_probe.wait_for_go(os.environ["BENCH_SCALE_READY"])
    start_listen(args)


async def enqueue(tasks: int, in_flight: int) -> None:
    """Connect, gate on SIGUSR1, ``kiq`` ``tasks`` tasks, record the wall time (s)."""
    go = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, go.set)
    await broker.startup()
    ready = Path(os.environ["BENCH_SCALE_READY"])
    ready.with_suffix(".part").write_text(str(os.getpid()))
    ready.with_suffix(".part").rename(ready)
    await go.wait()
    t0 = time.monotonic()
    sem = asyncio.Semaphore(in_flight)

    async def one() -> None:
        async with sem:
            await noop.kiq(PAYLOAD)
    await asyncio.gather(*(one() for _ in range(tasks)))
    wall = time.monotonic() - t0
    await broker.shutdown()
    done = Path(os.environ["BENCH_SCALE_DONE"])
    done.with_suffix(".part").write_text(json.dumps({"tasks": tasks, "wall_s": wall}))
    done.with_suffix(".part").rename(done)


def main() -> None:
    """Command line: ``worker [--max-async-tasks N]`` or ``enqueue --tasks N``."""
    p = argparse.ArgumentParser(prog="python -m bench.peers.taskiq_scale")
    p.add_argument("mode", choices=["worker", "enqueue"])
    p.add_argument("--tasks", type=int, default=0)
    p.add_argument("--in-flight", type=int, default=16)
    p.add_argument("--max-async-tasks", type=int, default=100)
    args = p.parse_args()
    if args.mode == "worker":
        run_worker(args.max_async_tasks)
    else:
        asyncio.run(enqueue(args.tasks, args.in_flight))


if __name__ == "__main__":
    sys.exit(main())
