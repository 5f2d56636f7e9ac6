"""Chaos: a chain whose worker is SIGKILLed between its steps still runs to its end.

Real processes: a private redis-server, ``python -m dtq_gateway`` (1 s visibility
timeout) and ``dtq-pyworker`` processes of ``tests/system/apps/chaos_app.py``.
"""

from __future__ import annotations

import pytest

from dtq_proto import dtq_pb2
from tests.system.chaos_invariant import ChaosEnv, check_invariant
from tests.system.chaos_support import wait_until

pytestmark = pytest.mark.chaos


def test_chain_survives_a_worker_sigkill_between_steps(chaos: ChaosEnv) -> None:
    gw = chaos.gateway()
    client = chaos.client(gw.target)
    release = chaos.dir / "release"
    first = client.enqueue("chaos", "chaos.sleep", {"sleep_s": 0}, chain=[
        {"queue": "chaos", "task_type": "chaos.block", "payload": {"until_file": str(release)}},
        {"queue": "chaos", "task_type": "chaos.sleep"}])  # gets the block step's result
    a_id, (b_id, c_id) = first.task_id, first.chain_task_ids
    doomed = chaos.worker(gw.target, "w-doomed", concurrency=2)
    wait_until(lambda: chaos.runs("start", b_id), 20, "w-doomed to start step 2")
    doomed.kill()  # step 1 succeeded, step 2 dies with its worker
    assert client.get_task(a_id).chain_state == dtq_pb2.CHAIN_STATE_CONTINUED
    release.touch()
    chaos.worker(gw.target, "w-rescue", concurrency=2)

    last = client.wait_chain(first, 30)

    assert (last.task_id, last.status) == (c_id, dtq_pb2.TASK_STATUS_SUCCEEDED)
    tasks = check_invariant(chaos, client, [a_id, b_id, c_id])
    b = tasks[b_id]
    assert (b.attempt, b.worker_id, b.attempts[0].outcome) == (2, "w-rescue", "lease_expired")
    assert tasks[c_id].payload == {"released": True}  # step 2's result (decoded)
    assert [tasks[t].chain_step for t in (a_id, b_id, c_id)] == [0, 1, 2]
    assert {tasks[t].chain_id for t in (a_id, b_id, c_id)} == {a_id}
    assert len(chaos.runs("done", a_id)) == 1 and len(chaos.runs("done", c_id)) == 1
