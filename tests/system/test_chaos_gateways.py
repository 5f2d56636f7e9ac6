"""Chaos: two gateways on one Redis, and the scheduler leader is SIGKILLed mid-run.

The leader (named by ``dtq:lock:scheduler``) moves due delayed tasks and retries
and runs the reaper. Killed without releasing the lock, it must be replaced by the
other gateway within the lock TTL (10 s), and every delayed or retried task must
still fire exactly once, never early.
"""

from __future__ import annotations

import time

import pytest

from dtq_gateway.store import keys
from dtq_proto import dtq_pb2
from tests.system.chaos_invariant import ChaosEnv, check_invariant
from tests.system.chaos_support import wait_until

pytestmark = pytest.mark.chaos

#: Lock TTL of the scheduler leader (ms), docs/design.md.
LOCK_TTL_S = 10.0
#: Followers try to take the lock every 1-2 s; allow that on top of the TTL (s).
TAKEOVER_SLACK_S = 2.5


def lock_holder(env: ChaosEnv) -> str | None:
    """Gateway id named by the scheduler lock (its value is ``<gateway_id>:<token>``)."""
    value = env.rds.get(keys.SCHEDULER_LOCK)
    return value.rpartition(":")[0] if value else None


def test_scheduler_leader_killed_delayed_and_retried_tasks_fire_once(chaos: ChaosEnv) -> None:
    gateways = {g.gateway_id: g for g in (chaos.gateway("chaos-gw-a"),
                                           chaos.gateway("chaos-gw-b"))}
    leader_id = wait_until(lambda: lock_holder(chaos), 15, "a scheduler leader")
    leader = gateways.pop(leader_id)
    follower = next(iter(gateways.values()))
    client = chaos.client(follower.target)
    chaos.worker(follower.target, "w-follower", concurrency=4)
    delays_ms = [300 + i * 1000 for i in range(13)]  # due before, during and after takeover
    delayed = {client.enqueue("chaos", "chaos.sleep", {"sleep_s": 0},
                              delay_ms=d).task_id: d for d in delays_ms}
    retried = [client.enqueue("chaos", "chaos.fail_once", {"retry_after_s": 2.0}).task_id
               for _ in range(6)]
    wait_until(lambda: all(client.get_task(t).status == dtq_pb2.TASK_STATUS_SCHEDULED
                           and client.get_task(t).attempt == 2 for t in retried), 15,
               "every fail_once task to wait for its retry")

    leader.kill()
    killed_at = time.monotonic()
    left_s = chaos.rds.pttl(keys.SCHEDULER_LOCK) / 1000  # TTL the dead leader's lock had left
    wait_until(lambda: lock_holder(chaos) == follower.gateway_id,
               LOCK_TTL_S + TAKEOVER_SLACK_S, "the follower to take the scheduler lock")
    takeover_s = time.monotonic() - killed_at

    tasks = check_invariant(chaos, client, [*delayed, *retried], timeout_s=30)
    assert 0 < left_s <= LOCK_TTL_S
    assert left_s - 0.5 <= takeover_s <= left_s + TAKEOVER_SLACK_S, (left_s, takeover_s)
    assert all(t.status == dtq_pb2.TASK_STATUS_SUCCEEDED for t in tasks.values())
    for tid, delay_ms in delayed.items():
        assert [r["attempt"] for r in chaos.runs("start", tid)] == [1]
        assert chaos.events.count("TASK_STARTED", tid) == 1
        assert tasks[tid].started_at_ms >= tasks[tid].created_at_ms + delay_ms
    for tid in retried:
        assert [r["attempt"] for r in chaos.runs("start", tid)] == [1, 2]
        assert chaos.events.count("TASK_STARTED", tid) == 2
        first, second = tasks[tid].attempts
        assert (first.outcome, second.outcome) == ("failed", "succeeded")
        assert second.started_at_ms >= first.finished_at_ms + 2000
    print(f"scheduler lock taken over {takeover_s:.1f}s after the leader was killed "
          f"({left_s:.1f}s of its TTL were left)")
