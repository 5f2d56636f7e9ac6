"""``Worker(pool="process")`` against the in-process gateway and a private Redis:
hard timeouts, dead children, cancellation and progress across the process boundary."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
import signal
import sys
from pathlib import Path

import pytest

from dtq_proto import dtq_pb2
from dtq_pyworker import AsyncClient, TaskStatus, Worker
from tests.support.leasing import wait_until
from tests.worker import process_handlers as h
from tests.worker.helpers import running

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
POLL_S = 0.02  # GetTask poll interval, bounded by each wait's deadline
NEXT_TASK_S = 1.0  # the bound: the task after a killed/dead child starts within 1 s
#: A retry far in the future: a failed attempt stays SCHEDULED while the test looks.
LATE_RETRY = {"backoff_base_ms": 600_000, "backoff_cap_ms": 600_000}


def _worker(gateway, **kwargs) -> Worker:
    kwargs.setdefault("worker_id", "w-proc")
    kwargs.setdefault("drain_grace_s", 5)
    kwargs.setdefault("concurrency", 1)
    worker = Worker(["proc"], f"127.0.0.1:{gateway.port}", pool="process", **kwargs)
    for name in ("echo", "c_sleep", "abort", "hold", "polite", "refuse", "later", "async_pid",
                 "async_ignore"):
        worker.register(name, getattr(h, name))
    return worker


async def _poll_task(client, task_id, predicate, timeout_s=20.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        task = await client.get_task(task_id)
        if predicate(task):
            return task
        assert asyncio.get_running_loop().time() < deadline, task
        await asyncio.sleep(POLL_S)


async def _gone(pid: int, timeout_s: float = 10.0) -> None:
    """Wait until no process has ``pid`` (our children are reaped by the forkserver)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        assert asyncio.get_running_loop().time() < deadline, f"process {pid} still alive"
        await asyncio.sleep(POLL_S)


def _failed_once(error_class):
    return lambda t: (len(t.attempts) == 1 and t.attempts[0].outcome == "failed"
                      and t.attempts[0].error_class == error_class)


async def test_handler_stuck_in_c_is_killed_at_its_timeout_and_the_next_task_runs(gateway):
    worker = _worker(gateway)
    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client, running(worker):
        first = await client.wait((await client.enqueue("proc", "echo", {})).task_id, 20)
        stuck = await client.enqueue("proc", "c_sleep", {"s": 120}, timeout_ms=500,
                                     max_attempts=3, retry_policy=LATE_RETRY)
        after = await client.enqueue("proc", "echo", {"n": 2})
        failed = await _poll_task(client, stuck.task_id, _failed_once("Timeout"))
        done = await client.wait(after.task_id, 20)
        await _gone(first.result["pid"])
    assert failed.status is TaskStatus.SCHEDULED  # Timeout is retryable: a retry waits
    assert failed.attempts[0].error_message == "handler exceeded timeout_ms=500"
    assert done.status is TaskStatus.SUCCEEDED
    assert done.result["pid"] != first.result["pid"]  # the slot's child was replaced
    gap_s = done.result["ran_at"] - failed.attempts[0].finished_at.timestamp()
    assert gap_s < NEXT_TASK_S, gap_s
    assert worker.stats["timeouts"] == 1 and worker.stats["processed"] == 2


async def test_child_that_aborts_fails_only_its_own_task(gateway):
    worker = _worker(gateway, concurrency=2)
    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client, running(worker):
        held = await client.enqueue("proc", "hold", {"s": 2})
        await _poll_task(client, held.task_id, lambda t: t.status is TaskStatus.ACTIVE)
        dead = await client.enqueue("proc", "abort", {}, max_attempts=3,
                                    retry_policy=LATE_RETRY)
        failed = await _poll_task(client, dead.task_id, _failed_once("HandlerProcessDied"))
        after = await client.enqueue("proc", "echo", {})
        done = await client.wait(after.task_id, 20)
        held_done = await client.wait(held.task_id, 20)
    assert failed.status is TaskStatus.SCHEDULED  # retryable, per the retry policy
    assert "killed by signal SIGABRT" in failed.attempts[0].error_message
    assert held_done.status is TaskStatus.SUCCEEDED  # the other child ran on
    assert done.status is TaskStatus.SUCCEEDED
    gap_s = done.result["ran_at"] - failed.attempts[0].finished_at.timestamp()
    assert gap_s < NEXT_TASK_S, gap_s
    assert worker._executor.started == 3  # one child per slot, one replacement


async def test_handler_errors_and_async_handlers_map_as_with_threads(gateway):
    worker = _worker(gateway)
    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client, running(worker):
        refused = await client.wait((await client.enqueue("proc", "refuse", {})).task_id, 20,
                                    raise_on_failure=False)
        later = await client.enqueue("proc", "later", {}, max_attempts=3)
        retried = await _poll_task(client, later.task_id, _failed_once("Retry"))
        ran = await client.wait((await client.enqueue("proc", "async_pid", {})).task_id, 20)
    assert refused.status is TaskStatus.DEAD_LETTERED
    assert refused.attempts[0].error_class == "PermanentError"
    assert refused.attempts[0].error_message == "bad input"
    assert retried.status is TaskStatus.SCHEDULED
    assert 29_000 <= retried.due_at_ms - retried.attempts[0].finished_at.timestamp() * 1000 <= 31_000
    assert ran.result["pid"] != os.getpid()  # the async handler ran in a child


async def test_cancel_kills_a_child_that_ignores_it_after_the_grace(gateway, caplog):
    grace_s = 0.5
    worker = _worker(gateway, cancel_grace_s=grace_s, concurrency=2)
    loop = asyncio.get_running_loop()
    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client, running(worker):
        # a sync handler in C code, and an async one: neither is cancelled in its child
        stuck = [(await client.enqueue("proc", name, {"s": 120})).task_id
                 for name in ("c_sleep", "async_ignore")]
        # the child's ctx.progress reaches the gateway through the parent's heartbeat
        active = [await _poll_task(client, t, lambda t: t.progress_message != "")
                  for t in stuck]
        pids = [int(a.progress_message) for a in active]
        asked = loop.time()
        for task_id in stuck:
            assert (await client.cancel(task_id)).cancel_requested
        for pid in pids:
            await _gone(pid)
        killed_after_s = loop.time() - asked
        cancelled = [await client.wait(t, 20, raise_on_failure=False) for t in stuck]
        done = await client.wait((await client.enqueue("proc", "echo", {})).task_id, 20)
    assert killed_after_s >= grace_s  # the handlers had their grace first
    assert [a.progress_percent for a in active] == [1.0, 1.0]
    assert [c.status for c in cancelled] == [dtq_pb2.TASK_STATUS_CANCELLED] * 2
    assert worker.stats["cancelled"] == 2
    assert done.status is TaskStatus.SUCCEEDED and done.result["pid"] not in pids
    gc.collect()  # an unread future exception is logged when the future is collected
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_cancel_lets_a_handler_that_stops_keep_its_process(gateway):
    worker = _worker(gateway, cancel_grace_s=30)
    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client, running(worker):
        task = await client.enqueue("proc", "polite", {})
        active = await _poll_task(client, task.task_id, lambda t: t.progress_message != "")
        await client.cancel(task.task_id)
        cancelled = await client.wait(task.task_id, 20, raise_on_failure=False)
        done = await client.wait((await client.enqueue("proc", "echo", {})).task_id, 20)
    assert cancelled.status == dtq_pb2.TASK_STATUS_CANCELLED
    assert done.result["pid"] == int(active.progress_message)  # not killed: reused


async def test_process_pool_needs_module_level_handlers():
    worker = Worker(["proc"], "127.0.0.1:1", pool="process")

    @worker.task("nested")
    def nested(payload, ctx):
        return None

    with pytest.raises(ValueError, match="handler of 'nested': pool='process' needs"):
        await worker.run_async(install_signal_handlers=False)


def test_unknown_pool_is_refused():
    worker = Worker(["proc"], "127.0.0.1:1")
    assert (worker.pool, worker.cancel_grace_s) == ("thread", 2.0)  # the defaults
    with pytest.raises(ValueError, match="pool: 'fork' is not one of thread, process"):
        Worker(["proc"], "127.0.0.1:1", pool="fork")
    with pytest.raises(ValueError, match="cancel_grace_s"):
        Worker(["proc"], "127.0.0.1:1", cancel_grace_s=-1)


def test_bench_smoke_prints_both_pools(capsys, tmp_path):
    from bench import process_pool

    out = tmp_path / "pp.json"
    results = process_pool.main(["--tasks", "40", "--calls", "40", "--concurrency", "2",
                                 "--json", str(out)])
    printed = capsys.readouterr().out
    assert printed.startswith("thread ") and "\nprocess " in printed
    assert "process pool extra cost:" in printed
    for pool in ("thread", "process"):
        assert results[pool]["dispatch_us_per_call"] > 0
        assert results[pool]["end_to_end"]["tasks"] == 40
    assert set(results["process_extra_us_per_task"]) == {"dispatch", "end_to_end"}
    assert out.exists()


def _doc_example() -> str:
    text = (ROOT / "docs" / "handlers.md").read_text(encoding="utf-8")
    return re.search(r"```python\n(# hard_limits\.py\n.*?)```", text, re.DOTALL).group(1)


async def _stop_cli(proc: asyncio.subprocess.Process) -> int:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    return await asyncio.wait_for(proc.wait(), 30)


async def test_handlers_md_example_runs_under_dtq_pyworker_pool_process(gateway, tmp_path):
    (tmp_path / "hard_limits.py").write_text(_doc_example(), encoding="utf-8")
    target = f"127.0.0.1:{gateway.port}"
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "dtq-pyworker"), "hard_limits:worker", "--pool", "process",
        "--target", target, cwd=tmp_path, stderr=asyncio.subprocess.PIPE)
    try:
        async with AsyncClient(target) as client:
            stuck = await client.enqueue("media", "media.transcode", {"seconds": 60},
                                         timeout_ms=2000, max_attempts=1)
            seen = await _poll_task(client, stuck.task_id, lambda t: t.progress_message != "")
            timed_out = await client.wait(stuck.task_id, 30, raise_on_failure=False)
            quick = await client.enqueue("media", "media.transcode", {"seconds": 0})
            done = await client.wait(quick.task_id, 30)
    finally:
        code = await _stop_cli(proc)
    log = (await proc.stderr.read()).decode()
    assert (seen.progress_percent, seen.progress_message) == (10.0, "starting")
    attempt = timed_out.attempts[0]
    assert attempt.error_class == "Timeout", log
    assert 2.0 <= (attempt.finished_at - attempt.started_at).total_seconds() < 10
    assert done.status is TaskStatus.SUCCEEDED
    assert done.result["pid"] not in (proc.pid, os.getpid())  # a child of the worker
    assert "pool=process" in log and code == 0, log


async def test_cli_refuses_a_nested_handler_under_pool_process_with_status_2(tmp_path):
    (tmp_path / "nested_app.py").write_text(
        "from dtq_pyworker import Worker\n\n"
        "def make():\n"
        "    worker = Worker(['q'], '127.0.0.1:1')\n"
        "    worker.register('t', lambda payload, ctx: None)\n"
        "    return worker\n", encoding="utf-8")
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "dtq-pyworker"), "nested_app:make", cwd=tmp_path,
        env={**os.environ, "DTQ_POOL": "process"}, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert "handler of 't': pool='process' needs a module-level function" in err.decode()


async def test_drain_kills_a_stuck_child_and_hands_its_task_back(gateway):
    worker = _worker(gateway, drain_grace_s=0.3)
    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client:
        stuck = await client.enqueue("proc", "c_sleep", {"s": 120}, max_attempts=3)
        run = asyncio.create_task(worker.run_async(install_signal_handlers=False))
        active = await _poll_task(client, stuck.task_id, lambda t: t.progress_message != "")
        worker.stop()
        await asyncio.wait_for(run, 30)  # does not wait for the 120 s C sleep
        await _gone(int(active.progress_message))
        released = await _poll_task(client, stuck.task_id,
                                    lambda t: t.status is TaskStatus.QUEUED)
    assert released.attempts[-1].outcome == "released"
    assert worker.stats["released"] == 1


async def test_an_idle_child_killed_from_outside_is_replaced(gateway):
    worker = _worker(gateway)
    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client, running(worker):
        first = await client.wait((await client.enqueue("proc", "echo", {})).task_id, 20)
        os.kill(first.result["pid"], signal.SIGKILL)  # as the OOM killer would
        await _gone(first.result["pid"])
        done = await client.wait((await client.enqueue("proc", "echo", {})).task_id, 20)
    assert done.status is TaskStatus.SUCCEEDED and done.result["pid"] != first.result["pid"]


SCRIPT = '''\
import sys

from dtq_pyworker import Worker


def double(payload, ctx):
    return payload * 2


worker = Worker(["script"], sys.argv[1], pool="process")
worker.register("double", double)

if __name__ == "__main__":
    worker.run()
'''


async def test_a_script_with_a_main_guard_runs_its_own_handlers_in_children(gateway, tmp_path):
    (tmp_path / "script_worker.py").write_text(SCRIPT, encoding="utf-8")
    target = f"127.0.0.1:{gateway.port}"
    proc = await asyncio.create_subprocess_exec(sys.executable, "script_worker.py", target,
                                                cwd=tmp_path, stderr=asyncio.subprocess.PIPE)
    try:
        async with AsyncClient(target) as client:
            done = await client.wait((await client.enqueue("script", "double", 21)).task_id, 30)
    finally:
        code = await _stop_cli(proc)
    assert done.result == 42
    assert code == 0, (await proc.stderr.read()).decode()


GROUP_APP = '''\
import time

from dtq_pyworker import Worker

worker = Worker(["group"], pool="process", concurrency=1)


@worker.task("hold")
def hold(payload, ctx):
    open("started", "w").close()  # the test signals the group once the handler runs
    time.sleep(payload["s"])
    return {"held_s": payload["s"]}
'''


async def test_sigterm_to_the_process_group_lets_the_running_handler_finish(gateway, tmp_path):
    (tmp_path / "group_app.py").write_text(GROUP_APP, encoding="utf-8")
    target = f"127.0.0.1:{gateway.port}"
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "dtq-pyworker"), "group_app:worker", "--target", target, cwd=tmp_path,
        stderr=asyncio.subprocess.PIPE, start_new_session=True)
    try:
        async with AsyncClient(target) as client:
            task = await client.enqueue("group", "hold", {"s": 2})
            # ACTIVE comes at lease time, before the task reaches the worker: wait for
            # the handler itself (a task still in transit is released, not run)
            await wait_until(lambda: (tmp_path / "started").exists(), timeout_s=20)
            os.killpg(proc.pid, signal.SIGTERM)  # as systemd or `kill -- -PGID` would
            code = await asyncio.wait_for(proc.wait(), 30)  # it drains and exits
            done = await client.get_task(task.task_id)
    finally:
        await _stop_cli(proc)
    log = (await proc.stderr.read()).decode()
    assert done.status is TaskStatus.SUCCEEDED, f"{done.attempts}\n{log}"
    assert done.result == {"held_s": 2} and code == 0, log


KILL_APP = '''\
from dtq_pyworker import Worker
from tests.worker.process_handlers import c_sleep

worker = Worker(["orphan"], pool="process", concurrency=1)
worker.register("c_sleep", c_sleep)
'''


async def test_children_end_with_a_worker_killed_outright(gateway, tmp_path):
    (tmp_path / "kill_app.py").write_text(KILL_APP, encoding="utf-8")
    target = f"127.0.0.1:{gateway.port}"
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "dtq-pyworker"), "kill_app:worker", "--target", target, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=asyncio.subprocess.DEVNULL)
    try:
        async with AsyncClient(target) as client:
            task = await client.enqueue("orphan", "c_sleep", {"s": 120})
            active = await _poll_task(client, task.task_id, lambda t: t.progress_message != "")
        proc.kill()  # SIGKILL: no drain, no cleanup in the worker
        await asyncio.wait_for(proc.wait(), 30)
        await _gone(int(active.progress_message))  # not left blocked for 120 s
    finally:
        if proc.returncode is None:
            proc.kill()
