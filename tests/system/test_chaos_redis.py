"""Chaos: Redis SIGKILLed and restarted from its AOF mid-workload, then FLUSHALL.

After the restart every task still reaches exactly one terminal state. After a
FLUSHALL under idle Lease streams the gateway answers NOGROUP by recreating the
consumer groups, new tasks are processed, and it never spins: its CPU use over a
few seconds stays far below one core.
"""

from __future__ import annotations

import time

import pytest

from dtq_gateway import keys
from dtq_proto import dtq_pb2
from dtq_pyworker import Client, DtqRpcError
from tests.system.chaos_invariant import ChaosEnv, check_invariant
from tests.system.chaos_support import Proc, wait_until

pytestmark = pytest.mark.chaos

#: Idle CPU a gateway may use after FLUSHALL (fraction of one core).
MAX_IDLE_CPU = 0.25
#: Length of the CPU measurement window (s).
CPU_WINDOW_S = 3.0


def cpu_share(proc: Proc, window_s: float) -> float:
    """Fraction of one core ``proc`` used over the next ``window_s`` seconds.

    The wait is the measurement itself (utime + stime from /proc before and after),
    not a synchronisation.
    """
    before, started = proc.cpu_s(), time.monotonic()
    time.sleep(window_s)
    return (proc.cpu_s() - before) / (time.monotonic() - started)


def enqueue_when_up(client: Client, n: int, timeout_s: float = 20.0) -> list[str]:
    """Enqueue ``n`` quick tasks, retrying UNAVAILABLE while the gateway reconnects."""
    def attempt() -> list[str] | None:
        try:
            results = client.enqueue_batch(
                [{"queue": "chaos", "task_type": "chaos.sleep", "payload": {"sleep_s": 0.05},
                      "max_attempts": 5} for _ in range(n)])
        except DtqRpcError:
            return None
        assert all(not isinstance(r, Exception) for r in results), results
        return [r.task_id for r in results]
    return wait_until(attempt, timeout_s, "the gateway to accept enqueues again")


def succeeded(env: ChaosEnv) -> int:
    """TASK_SUCCEEDED events seen so far."""
    return sum(1 for e in env.events.snapshot() if e["type"] == "TASK_SUCCEEDED")


def test_redis_restart_then_flushall_every_task_terminal_no_hot_loop(chaos: ChaosEnv) -> None:
    gw = chaos.gateway()
    client = chaos.client(gw.target)
    ids = enqueue_when_up(client, 80)
    for n in (1, 2):
        chaos.worker(gw.target, f"w-{n}", concurrency=4)
    wait_until(lambda: succeeded(chaos) >= 20, 20, "a quarter of the tasks to finish")

    chaos.redis.restart()  # SIGKILL, then start again on the same port from the AOF
    assert succeeded(chaos) < len(ids), "the restart should hit a running workload"
    ids += enqueue_when_up(client, 20)

    tasks = check_invariant(chaos, client, ids, events_complete=False, timeout_s=60)
    assert all(t.status == dtq_pb2.TASK_STATUS_SUCCEEDED for t in tasks.values())
    assert gw.running, gw.log()

    chaos.rds.flushall()
    idle = cpu_share(gw, CPU_WINDOW_S)
    fresh = enqueue_when_up(client, 10)

    tasks = check_invariant(chaos, client, fresh, timeout_s=30)
    assert all(t.status == dtq_pb2.TASK_STATUS_SUCCEEDED for t in tasks.values())
    assert idle < MAX_IDLE_CPU, f"gateway used {idle:.2f} of a core while idle\n{gw.log()}"
    busy_after = cpu_share(gw, 1.0)
    assert busy_after < MAX_IDLE_CPU, f"gateway used {busy_after:.2f} of a core\n{gw.log()}"
    # The flushed scheduler lock is taken again (the reaper and scheduler resume).
    wait_until(lambda: chaos.rds.get(keys.SCHEDULER_LOCK), 12.5, "the scheduler lock to be retaken")
    assert chaos.events.reconnects >= 1
