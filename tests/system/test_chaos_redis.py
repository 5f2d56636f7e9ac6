"""Chaos: Redis SIGKILLed and restarted from its AOF mid-workload, then FLUSHALL.

After the restart every task still reaches exactly one terminal state. After a
FLUSHALL under idle Lease streams the gateway answers NOGROUP by recreating the
consumer groups, new tasks are processed, and it never spins: its CPU use over a
few seconds stays far below one core.
"""

from __future__ import annotations

import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dtq_gateway.store import keys
from dtq_proto import dtq_pb2
from dtq_pyworker import Client, DtqRpcError
from tests.system.chaos_invariant import ChaosEnv, check_invariant
from tests.system.chaos_support import GatewayProc, Proc, wait_until

pytestmark = pytest.mark.chaos

#: Idle CPU a gateway may use after FLUSHALL (fraction of one core).
MAX_IDLE_CPU = 0.25
#: Least time Redis stays down (s); the visibility timeout is 1 s.
OUTAGE_S = 2.0
#: Length of the CPU measurement window (s).
CPU_WINDOW_S = 3.0


def cpu_shares(procs: list[Proc], window_s: float) -> dict[str, float]:
    """Fraction of one core each process used over the next ``window_s`` seconds.

    The wait is the measurement itself (utime + stime from /proc before and after),
    not a synchronisation.
    """
    before, started = {p.name: p.cpu_s() for p in procs}, time.monotonic()
    time.sleep(window_s)
    elapsed = time.monotonic() - started
    return {p.name: round((p.cpu_s() - before[p.name]) / elapsed, 3) for p in procs}


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


def health(target: str) -> int:
    """Overall grpc.health.v1 status of a gateway (UNKNOWN when the call fails)."""
    with grpc.insecure_channel(target) as channel:
        try:
            return health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=2).status
        except grpc.RpcError:
            return health_pb2.HealthCheckResponse.UNKNOWN


def enqueue_refusal(client: Client) -> tuple[grpc.StatusCode, str] | None:
    """``(code, reason)`` of a refused Enqueue, or None when it was accepted."""
    try:
        client.enqueue("chaos", "chaos.sleep", {"sleep_s": 0})
    except DtqRpcError as err:
        return err.code, err.reason
    return None


def succeeded(env: ChaosEnv) -> int:
    """TASK_SUCCEEDED events seen so far."""
    return sum(1 for e in env.events.snapshot() if e["type"] == "TASK_SUCCEEDED")


def start_workload(env: ChaosEnv, n: int) -> tuple[GatewayProc, Client, list, list[str]]:
    """A gateway, two workers (concurrency 4) and ``n`` enqueued tasks."""
    gw = env.gateway()
    client = env.client(gw.target)
    ids = enqueue_when_up(client, n)
    workers = [env.worker(gw.target, f"w-{i}", concurrency=4) for i in (1, 2)]
    return gw, client, workers, ids


def test_redis_killed_and_restarted_from_aof_every_task_terminal(chaos: ChaosEnv) -> None:
    gw, client, _, ids = start_workload(chaos, 120)
    wait_until(lambda: succeeded(chaos) >= 20, 20, "some of the tasks to finish")

    chaos.redis.kill()
    killed_at = time.monotonic()
    assert succeeded(chaos) < len(ids), "the outage should hit a running workload"
    # The outage lasts until the gateway reports it, and at least OUTAGE_S (longer
    # than the visibility timeout, so leases held across it may be reclaimed).
    wait_until(lambda: health(gw.target) == health_pb2.HealthCheckResponse.NOT_SERVING
               and time.monotonic() - killed_at >= OUTAGE_S, 10,
               "health NOT_SERVING while Redis is down")
    assert enqueue_refusal(client) == (grpc.StatusCode.UNAVAILABLE, "REDIS_UNAVAILABLE")
    chaos.redis.start()  # same port and directory: the AOF replays
    outage_s = time.monotonic() - killed_at
    wait_until(lambda: health(gw.target) == health_pb2.HealthCheckResponse.SERVING, 10,
               "health SERVING after the restart")
    ids += enqueue_when_up(client, 20)

    tasks = check_invariant(chaos, client, ids, events_complete=False, timeout_s=60)
    assert all(t.status == dtq_pb2.TASK_STATUS_SUCCEEDED for t in tasks.values())
    assert chaos.events.reconnects >= 1 and gw.running
    reclaimed = sum(a.outcome == "lease_expired" for t in tasks.values() for a in t.attempts)
    print(f"redis outage {outage_s:.1f}s: {reclaimed} leases reclaimed afterwards")


def test_flushall_under_idle_lease_streams_groups_recreated_no_hot_loop(chaos: ChaosEnv) -> None:
    gw, client, workers, ids = start_workload(chaos, 20)
    check_invariant(chaos, client, ids)

    chaos.rds.flushall()
    idle = cpu_shares([gw, *workers], CPU_WINDOW_S)
    fresh = enqueue_when_up(client, 20)

    tasks = check_invariant(chaos, client, fresh)
    assert all(t.status == dtq_pb2.TASK_STATUS_SUCCEEDED for t in tasks.values())
    assert max(idle.values()) < MAX_IDLE_CPU, f"CPU share while idle: {idle}\n{gw.log()}"
    after = cpu_shares([gw, *workers], 1.0)
    assert max(after.values()) < MAX_IDLE_CPU, f"CPU share after the flush: {after}"
    stream = keys.stream("chaos", 5)
    assert [g["name"] for g in chaos.rds.xinfo_groups(stream)] == [keys.GROUP]
    # The flushed scheduler lock is taken again (the reaper and scheduler resume).
    wait_until(lambda: chaos.rds.get(keys.SCHEDULER_LOCK), 12.5, "the scheduler lock to be retaken")
    print(f"CPU share (of one core) after FLUSHALL: idle {idle}, then {after}")
