"""The Python worker library with per-key concurrency and label routing, against the
real in-process gateway (docs/fairness.md): a Worker with labels runs the tasks that
require them, and tasks of one concurrency key never run more than the limit at once
in the worker's handlers."""

from __future__ import annotations

import asyncio

import grpc

from dtq_proto import dtq_pb2, dtq_pb2_grpc
from dtq_pyworker import AsyncClient, TaskStatus, Worker
from tests.worker.helpers import running


async def test_worker_runs_labelled_tasks_within_the_key_limit(gateway) -> None:
    target = f"127.0.0.1:{gateway.port}"
    async with grpc.aio.insecure_channel(target) as channel:
        await dtq_pb2_grpc.AdminStub(channel).SetConcurrencyLimit(
            dtq_pb2.SetConcurrencyLimitRequest(queue="fw", max_active_per_key=2))
    worker = Worker(["fw"], target, worker_id="w-fair", concurrency=8,
                    labels={"gpu": "a100"}, drain_grace_s=5)
    now = {"k": 0}
    most = {"k": 0}

    @worker.task("render")
    async def render(payload, ctx):
        now["k"] += 1
        most["k"] = max(most["k"], now["k"])
        await asyncio.sleep(0.05)  # the handler's work, not a synchronisation
        now["k"] -= 1
        return {}

    async with AsyncClient(target) as client, running(worker):
        ids = [(await client.enqueue("fw", "render", {}, concurrency_key="k",
                                     required_labels={"gpu": "a100"})).task_id
               for _ in range(8)]
        done = [await client.wait(task_id, 30) for task_id in ids]
    assert all(t.status is TaskStatus.SUCCEEDED for t in done)
    assert most["k"] == 2  # 8 handler slots, but at most 2 tasks of the key at once


async def test_enqueue_batch_takes_concurrency_key_and_required_labels(gateway) -> None:
    target = f"127.0.0.1:{gateway.port}"
    async with AsyncClient(target) as client:
        results = await client.enqueue_batch([
            {"queue": "fb", "task_type": "render", "payload": {}, "concurrency_key": "k",
             "required_labels": {"gpu": "a100"}}])
        task = await client.get_task(results[0].task_id)
    assert task.raw.concurrency_key == "k"
    assert dict(task.raw.required_labels) == {"gpu": "a100"}
