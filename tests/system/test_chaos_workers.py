"""Chaos: workers that die, freeze, kill themselves, or sit on a cancelled task.

Real processes throughout: a private redis-server, ``python -m dtq_gateway`` with a
1 s visibility timeout and 0.3 s heartbeat, and ``dtq-pyworker`` processes running
``tests/system/apps/chaos_app.py``. Each scenario ends with the suite invariant.
"""

from __future__ import annotations

import signal
import threading
import time

import grpc
import pytest

from dtq_proto import dtq_pb2, dtq_pb2_grpc
from tests.system.chaos_invariant import ChaosEnv, check_invariant
from tests.system.chaos_support import wait_until

pytestmark = pytest.mark.chaos

SUCCEEDED = dtq_pb2.TASK_STATUS_SUCCEEDED


def started_by(env: ChaosEnv, worker_id: str) -> dict[str, dict]:
    """Run-log ``start`` rows of one worker, by task id (last one wins)."""
    return {r["task_id"]: r for r in env.runs("start") if r["worker_id"] == worker_id}


def test_sigkilled_worker_tasks_complete_elsewhere_after_the_timeout(chaos: ChaosEnv) -> None:
    gw = chaos.gateway()
    client = chaos.client(gw.target)
    ids = [client.enqueue("chaos", "chaos.sleep", {"sleep_s": 0.4}).task_id for _ in range(12)]
    doomed = chaos.worker(gw.target, "w-doomed", concurrency=4, max_in_flight=6)
    wait_until(lambda: len(started_by(chaos, "w-doomed")) >= 4, 20, "w-doomed to start 4 tasks")
    doomed.kill()
    held = {t for t in ids if client.get_task(t).worker_id == "w-doomed"
            and client.get_task(t).status == dtq_pb2.TASK_STATUS_ACTIVE}
    assert len(held) >= 4, "the killed worker should have held its running tasks"
    killed_at = time.monotonic()
    chaos.worker(gw.target, "w-rescue", concurrency=4)

    tasks = check_invariant(chaos, client, ids)

    assert all(t.status == SUCCEEDED for t in tasks.values())
    for tid in held:
        task = tasks[tid]
        assert task.worker_id == "w-rescue" and task.attempt == 2, task
        assert task.attempts[0].outcome == "lease_expired"
        assert task.attempts[0].error_class == "LeaseExpired"
        # Not before the visibility timeout: the finish comes after it.
        assert chaos.events.count("TASK_RETRIED", tid) == 1
    assert time.monotonic() - killed_at >= 1.0
