"""Batch handlers (``Worker.batch_task``) against the in-process gateway and a private
Redis: per-item results and retries, a batch that raises, max_wait_ms, the time limit,
cancelling one item, draining, and refused registrations."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import sys
from pathlib import Path

import pytest

from dtq_pyworker import AsyncClient, Retry, TaskStatus, Worker
from tests.worker.helpers import poll_until, running

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
#: A retry due almost at once (the failed items come back in a second batch).
QUICK_RETRY = {"backoff_base_ms": 50, "backoff_cap_ms": 50}
WAIT_S = 30.0  # deadline of each wait for a task's end (the CPU is shared)


def _worker(gateway, **kwargs) -> Worker:
    kwargs.setdefault("worker_id", "w-batch")
    kwargs.setdefault("drain_grace_s", 5)
    kwargs.setdefault("concurrency", 2)
    kwargs.setdefault("max_in_flight", 128)
    return Worker(["batch"], f"127.0.0.1:{gateway.port}", **kwargs)


async def _enqueue_all(client: AsyncClient, task_type: str, payloads, **options) -> list[str]:
    results = await client.enqueue_batch(
        [{"queue": "batch", "task_type": task_type, "payload": p, **options} for p in payloads])
    return [r.task_id for r in results]


async def _wait_all(client: AsyncClient, task_ids) -> list:
    return [await client.wait(t, WAIT_S, raise_on_failure=False) for t in task_ids]


async def test_batch_of_100_with_3_failing_items_acks_97_and_retries_the_3_alone(gateway):
    worker = _worker(gateway)
    calls: list[list[int]] = []
    failing = {7, 42, 99}

    @worker.batch_task("embed", max_size=100, max_wait_ms=5000)
    def embed(payloads, ctxs):
        calls.append([p["n"] for p in payloads])
        return [RuntimeError(f"item {p['n']} broke") if p["n"] in failing and c.attempt == 1
                else {"n": p["n"], "attempt": c.attempt} for p, c in zip(payloads, ctxs)]

    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client:
        ids = await _enqueue_all(client, "embed", [{"n": n} for n in range(100)],
                                 max_attempts=3, retry_policy=QUICK_RETRY)
        async with running(worker):
            tasks = await _wait_all(client, ids)
    assert sorted(calls[0]) == list(range(100))  # one call for the whole batch
    assert sorted(n for call in calls[1:] for n in call) == sorted(failing)  # the 3 alone
    assert all(t.status is TaskStatus.SUCCEEDED for t in tasks)
    for n, task in enumerate(tasks):
        if n in failing:
            assert [a.outcome for a in task.attempts] == ["failed", "succeeded"]
            assert task.attempts[0].error_class == "RuntimeError"
            assert task.attempts[0].error_message == f"item {n} broke"
            assert task.result == {"n": n, "attempt": 2}
        else:
            assert len(task.attempts) == 1 and task.result == {"n": n, "attempt": 1}
    assert worker.stats["processed"] == 100 and worker.stats["failed"] == 3


async def test_an_item_returned_as_retry_is_retried_after_its_delay(gateway):
    worker = _worker(gateway)

    @worker.batch_task("later", max_size=10, max_wait_ms=500)
    async def later(payloads, ctxs):
        return [Retry(after_s=0.05) if c.attempt == 1 and p == 1 else p
                for p, c in zip(payloads, ctxs)]

    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client:
        ids = await _enqueue_all(client, "later", [0, 1, 2], max_attempts=2)
        async with running(worker):
            tasks = await _wait_all(client, ids)
    assert [t.status for t in tasks] == [TaskStatus.SUCCEEDED] * 3
    assert [len(t.attempts) for t in tasks] == [1, 2, 1]
    assert tasks[1].attempts[0].error_class == "Retry"


async def test_a_batch_that_raises_fails_every_item_each_retried_on_its_own(gateway):
    worker = _worker(gateway)
    sizes: list[int] = []

    @worker.batch_task("bulk_insert", max_size=10, max_wait_ms=2000)
    async def bulk_insert(payloads, ctxs):
        sizes.append(len(payloads))
        if any(c.attempt == 1 for c in ctxs):
            raise ConnectionError("database unavailable")
        # returning None: every item succeeds with a null result

    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client:
        ids = await _enqueue_all(client, "bulk_insert", [{"row": n} for n in range(10)],
                                 max_attempts=3, retry_policy=QUICK_RETRY)
        async with running(worker):
            tasks = await _wait_all(client, ids)
    assert sizes[0] == 10
    for task in tasks:
        assert task.status is TaskStatus.SUCCEEDED and task.result is None
        assert [a.outcome for a in task.attempts] == ["failed", "succeeded"]
        assert task.attempts[0].error_class == "ConnectionError"
        assert task.attempts[0].error_message == "database unavailable"


async def test_max_wait_ms_flushes_a_partial_batch(gateway):
    worker = _worker(gateway)
    sizes: list[int] = []

    @worker.batch_task("partial", max_size=100, max_wait_ms=200)
    def partial(payloads, ctxs):
        sizes.append(len(payloads))
        return payloads

    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client:
        ids = await _enqueue_all(client, "partial", [1, 2, 3])
        async with running(worker):
            tasks = await _wait_all(client, ids)
    assert [t.result for t in tasks] == [1, 2, 3]
    assert sum(sizes) == 3 and max(sizes) < 100


async def test_a_batch_past_its_smallest_timeout_fails_every_item_as_timeout(gateway):
    worker = _worker(gateway)

    seen_ctxs: list = []

    @worker.batch_task("slow", max_size=3, max_wait_ms=5000)
    async def slow(payloads, ctxs):
        seen_ctxs.extend(ctxs)
        await asyncio.sleep(60)

    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client:
        ids = await _enqueue_all(client, "slow", [0, 1], max_attempts=1, timeout_ms=60_000)
        ids += await _enqueue_all(client, "slow", [2], max_attempts=1, timeout_ms=300)
        async with running(worker):
            tasks = await _wait_all(client, ids)
    for task in tasks:
        assert task.status is TaskStatus.DEAD_LETTERED
        assert task.attempts[0].error_class == "Timeout"
        assert task.attempts[0].error_message == (
            "batch handler exceeded timeout_ms=300 (the smallest of its 3 tasks)")
    assert worker.stats["timeouts"] == 3
    assert len(seen_ctxs) == 3 and all(c.cancelled.is_set() for c in seen_ctxs)


async def test_cancelling_one_item_of_a_running_batch_is_visible_to_the_handler(gateway):
    worker = _worker(gateway)
    started = asyncio.Event()
    seen_cancelled: list[bool] = []

    @worker.batch_task("pair", max_size=2, max_wait_ms=5000)
    async def pair(payloads, ctxs):
        started.set()
        while not any(c.cancelled.is_set() for c in ctxs):
            await asyncio.sleep(0.01)
        seen_cancelled.extend(c.cancelled.is_set() for c in ctxs)
        return payloads

    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client:
        ids = await _enqueue_all(client, "pair", ["keep", "drop"])
        async with running(worker):
            await asyncio.wait_for(started.wait(), WAIT_S)
            assert (await client.cancel(ids[1], reason="test")).cancel_requested
            kept, dropped = await _wait_all(client, ids)
    assert seen_cancelled == [False, True]
    assert kept.status is TaskStatus.SUCCEEDED and kept.result == "keep"
    assert dropped.status is TaskStatus.CANCELLED
    assert worker.stats["cancelled"] == 1 and worker.stats["processed"] == 1


async def test_drain_lets_a_running_batch_finish_and_releases_a_gathering_one(gateway):
    worker = _worker(gateway, concurrency=1)
    started, let_go = asyncio.Event(), asyncio.Event()

    @worker.batch_task("first", max_size=2, max_wait_ms=5000)
    async def first(payloads, ctxs):
        started.set()
        await let_go.wait()
        return payloads

    @worker.batch_task("never", max_size=100, max_wait_ms=60_000)
    async def never(payloads, ctxs):  # pragma: no cover - released before it runs
        raise AssertionError("a gathering batch must not run during a drain")

    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client:
        ids = await _enqueue_all(client, "first", ["a", "b"])
        waiting = await _enqueue_all(client, "never", ["x"])
        task = asyncio.create_task(worker.run_async(install_signal_handlers=False))
        await asyncio.wait_for(started.wait(), WAIT_S)
        await poll_until(lambda: len(worker._runtime.held) == 3, WAIT_S)  # 2 run, 1 gathers
        worker.stop()
        let_go.set()
        await asyncio.wait_for(task, WAIT_S)
        done = await _wait_all(client, ids)
        released = await client.get_task(waiting[0])
    assert [t.result for t in done] == ["a", "b"]
    assert released.status is TaskStatus.QUEUED and released.attempt == 1  # no attempt spent
    assert worker.stats["released"] == 1


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"max_size": 0}, "max_size"), ({"max_size": 1.5}, "max_size"),
    ({"max_size": 10_001}, "max_size"), ({"max_wait_ms": -1}, "max_wait_ms"),
    ({"max_wait_ms": 60_001}, "max_wait_ms"), ({"max_wait_ms": "50"}, "max_wait_ms"),
])
def test_bad_batch_registration_is_refused_naming_the_field(kwargs, field):
    worker = Worker(["batch"], "127.0.0.1:1")
    with pytest.raises(ValueError, match=rf"^{field} of batch task 'b': "):
        worker.batch_task("b", **kwargs)(lambda payloads, ctxs: None)
    assert "b" not in worker.handlers


def test_batch_handlers_are_refused_with_the_process_pool():
    worker = Worker(["batch"], "127.0.0.1:1", pool="process")
    with pytest.raises(ValueError, match="batch task 'b': .* not supported with "
                                         "pool='process'"):
        worker.batch_task("b")(lambda payloads, ctxs: None)
    late = Worker(["batch"], "127.0.0.1:1")  # the CLI sets pool after registration
    late.batch_task("b")(lambda payloads, ctxs: None)
    late.pool = "process"
    with pytest.raises(ValueError, match="batch task 'b': .* not supported"):
        asyncio.run(late.run_async(install_signal_handlers=False))


async def test_a_max_in_flight_below_max_size_is_warned_about(gateway, caplog):
    worker = _worker(gateway, max_in_flight=4)

    @worker.batch_task("small", max_size=10, max_wait_ms=50)
    def small(payloads, ctxs):
        return payloads

    with caplog.at_level(logging.WARNING, logger="dtq_pyworker.worker"):
        async with running(worker):
            pass
    assert any("max_in_flight is below a batch handler's max_size" in r.getMessage()
               and r.max_size == 10 and r.max_in_flight == 4 for r in caplog.records)


async def test_a_wrong_number_of_results_fails_every_item_as_batch_result_error(gateway):
    worker = _worker(gateway)

    @worker.batch_task("short", max_size=2, max_wait_ms=5000)
    def short(payloads, ctxs):
        return payloads[:1]

    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client:
        ids = await _enqueue_all(client, "short", [1, 2], max_attempts=3)
        async with running(worker):
            tasks = await _wait_all(client, ids)
    for task in tasks:  # not retryable: dead-lettered after one attempt of three
        assert task.status is TaskStatus.DEAD_LETTERED and len(task.attempts) == 1
        assert task.attempts[0].error_class == "BatchResultError"
        assert task.attempts[0].error_message == (
            "batch handler returned 1 results for 2 tasks (want a list, same order)")


async def test_a_batch_still_running_when_the_drain_grace_ends_is_handed_back(gateway):
    worker = _worker(gateway, drain_grace_s=0.2)
    started = asyncio.Event()

    @worker.batch_task("stuck", max_size=2, max_wait_ms=5000)
    async def stuck(payloads, ctxs):
        started.set()
        await asyncio.Event().wait()

    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client:
        ids = await _enqueue_all(client, "stuck", [1, 2])
        task = asyncio.create_task(worker.run_async(install_signal_handlers=False))
        await asyncio.wait_for(started.wait(), WAIT_S)
        worker.stop()
        await asyncio.wait_for(task, WAIT_S)
        tasks = [await client.get_task(t) for t in ids]
    assert [(t.status, t.attempt) for t in tasks] == [(TaskStatus.QUEUED, 1)] * 2
    assert worker.stats["released"] == 2


def test_the_lease_request_counts_a_batch_as_max_size_tasks():
    worker = Worker(["batch"], "127.0.0.1:1", concurrency=3)
    worker.task("one")(lambda payload, ctx: None)
    assert worker._lease_request().concurrency == 3
    worker.batch_task("many", max_size=50)(lambda payloads, ctxs: None)
    worker.batch_task("few", max_size=5)(lambda payloads, ctxs: None)
    assert worker._lease_request().concurrency == 3 + 49 + 4


def _doc_example() -> str:
    text = (ROOT / "docs" / "handlers.md").read_text(encoding="utf-8")
    return re.search(r"```python\n(# bulk_insert\.py\n.*?)```", text, re.DOTALL).group(1)


async def test_handlers_md_batch_example_runs_under_dtq_pyworker(gateway, tmp_path):
    (tmp_path / "bulk_insert.py").write_text(_doc_example(), encoding="utf-8")
    target = f"127.0.0.1:{gateway.port}"
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "dtq-pyworker"), "bulk_insert:worker", "--target", target, cwd=tmp_path,
        stderr=asyncio.subprocess.PIPE)
    try:
        async with AsyncClient(target) as client:
            rows = [{"id": n, "later": n == 3} for n in range(5)]
            results = await client.enqueue_batch(
                [{"queue": "rows", "task_type": "rows.insert", "payload": r} for r in rows])
            tasks = await _wait_all(client, [r.task_id for r in results])
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), WAIT_S)
    log = (await proc.stderr.read()).decode()
    assert [t.result for t in tasks] == [{"stored": n} for n in range(5)], log
    assert [len(t.attempts) for t in tasks] == [1, 1, 1, 2, 1]
    assert tasks[3].attempts[0].error_class == "Retry"
    assert code == 0, log


def test_bench_smoke_prints_worker_cpu_per_task_for_both_modes(capsys, tmp_path):
    from bench import batch_handlers

    out = tmp_path / "bh.json"
    results = batch_handlers.main(["--tasks", "60", "--max-size", "20", "--concurrency", "2",
                                   "--json", str(out)])
    printed = capsys.readouterr().out
    assert printed.startswith("single worker CPU ") and "\nbatch  worker CPU " in printed
    assert "x less worker CPU per task" in printed
    for mode in ("single", "batch"):
        assert results[mode]["tasks"] == 60 and results[mode]["cpu_us_per_task"] > 0
    assert results["single"]["calls"] == 60 and results["batch"]["calls"] < 60
    assert results["cpu_ratio_single_over_batch"] > 0
    assert out.exists()


async def test_leases_are_heartbeated_while_a_batch_gathers_and_while_it_runs(gateway):
    # the test gateway's visibility timeout is 2 s: both phases outlast it
    worker = _worker(gateway)
    runs: list[int] = []

    @worker.batch_task("patient", max_size=10, max_wait_ms=3000)
    def patient(payloads, ctxs):
        runs.append(len(payloads))
        ctxs[0].cancelled.wait(3.0)  # runs 3 s, longer than the visibility timeout
        return payloads

    async with AsyncClient(f"127.0.0.1:{gateway.port}") as client:
        ids = await _enqueue_all(client, "patient", [1, 2], max_attempts=1)
        async with running(worker):
            tasks = await _wait_all(client, ids)
    assert [(t.status, len(t.attempts), t.result) for t in tasks] == [
        (TaskStatus.SUCCEEDED, 1, 1), (TaskStatus.SUCCEEDED, 1, 2)]
    assert runs == [2] and worker.stats["stale"] == 0 and worker.stats["lost"] == 0


@pytest.mark.parametrize("value", [{"a": 1}, "ok", [1, 2, 3]])
def test_a_result_that_is_not_one_entry_per_task_fails_each_as_batch_result_error(value):
    from dtq_proto import dtq_pb2
    from dtq_pyworker._batch import map_results
    from dtq_pyworker._execute import Execution

    items = [Execution(task=dtq_pb2.LeasedTask(lease_id=f"l{n}"), ctx=None) for n in (1, 2)]
    outcomes = map_results(items, value)
    assert sorted(outcomes) == ["l1", "l2"]
    for outcome in outcomes.values():
        assert outcome.ack_result is None
        assert (outcome.fail.error_class, outcome.fail.retryable) == ("BatchResultError", False)
