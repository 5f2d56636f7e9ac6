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

from dtq_gateway.store import keys
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
    # Tasks whose handler never finished before the kill: no Ack of them can have been
    # sent (one sent just before the kill could still land after it, on a loaded machine).
    finished = {r["task_id"] for r in chaos.runs("done") if r["worker_id"] == "w-doomed"}
    held = {t for t in set(ids) - finished if client.get_task(t).worker_id == "w-doomed"
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


def stale_calls(target: str, worker_id: str, lease_ids: list[str]) -> tuple[list, list[str]]:
    """Ack each lease on its own and heartbeat them all, as the frozen worker would.

    Returns:
        ``[(code, reason)]`` of the Acks and the heartbeat's lost lease ids.
    """
    from tests.support.leasing import error_reason

    refused = []
    with grpc.insecure_channel(target) as channel:
        stub = dtq_pb2_grpc.BrokerStub(channel)
        for lease_id in lease_ids:
            try:
                stub.Ack(dtq_pb2.AckRequest(items=[dtq_pb2.AckItem(lease_id=lease_id,
                                                                   result=b"{}")]), timeout=5)
                refused.append((grpc.StatusCode.OK, ""))
            except grpc.RpcError as err:
                refused.append((err.code(), error_reason(err)))
        beat = stub.Heartbeat(dtq_pb2.HeartbeatRequest(worker_id=worker_id,
                                                       lease_ids=lease_ids), timeout=5)
    return refused, list(beat.lost_lease_ids)


def test_sigstopped_worker_late_ack_and_heartbeat_are_rejected(chaos: ChaosEnv) -> None:
    gw = chaos.gateway()
    client = chaos.client(gw.target)
    ids = [client.enqueue("chaos", "chaos.sleep", {"sleep_s": 1.2}).task_id for _ in range(4)]
    frozen = chaos.worker(gw.target, "w-frozen", concurrency=4, max_in_flight=4)
    wait_until(lambda: len(started_by(chaos, "w-frozen")) == 4, 20, "w-frozen to start 4 tasks")
    frozen.send(signal.SIGSTOP)
    rescue = chaos.worker(gw.target, "w-rescue", concurrency=4)
    # The pause lasts until every task was re-leased to and acked by the new owner.
    wait_until(lambda: all(client.get_task(t).status == SUCCEEDED for t in ids), 20,
               f"w-rescue to finish the frozen worker's tasks\n{chaos.logs()}")
    stale = [started_by(chaos, "w-frozen")[t]["lease_id"] for t in ids]

    acks, lost = stale_calls(gw.target, "w-frozen", stale)

    assert acks == [(grpc.StatusCode.FAILED_PRECONDITION, "STALE_LEASE")] * 4
    assert sorted(lost) == sorted(stale)
    resumed_ms = int(chaos.rds.time()[0]) * 1000
    frozen.send(signal.SIGCONT)
    rescue.terminate()
    marker = client.enqueue("chaos", "chaos.sleep", {"sleep_s": 0}).task_id
    # The resumed worker heartbeats, and acks the marker after its late results (FIFO).
    wait_until(lambda: client.get_task(marker).status == SUCCEEDED
               and int(chaos.rds.hget(keys.worker("w-frozen"), "last_heartbeat") or 0)
               > resumed_ms, 20, f"the resumed worker to beat and ack a marker\n{chaos.logs()}")
    assert client.get_task(marker).worker_id == "w-frozen"
    told = frozen.log_path.read_text()
    assert any(s in told for s in ("lease no longer current", "lease lost", "heartbeat stopped"))
    tasks = check_invariant(chaos, client, [*ids, marker])
    for tid in ids:
        task = tasks[tid]
        assert [(a.worker_id, a.outcome) for a in task.attempts] == [
            ("w-frozen", "lease_expired"), ("w-rescue", "succeeded")], task
        assert chaos.events.count("TASK_SUCCEEDED", tid) == 1


def test_stalled_worker_gets_no_new_leases(chaos: ChaosEnv) -> None:
    """A SIGSTOPped worker's Lease stream stays open, but the gateway must not feed it:
    leases sent there would expire unread and burn attempts while others idle."""
    gw = chaos.gateway()
    client = chaos.client(gw.target)
    frozen = chaos.worker(gw.target, "w-frozen", concurrency=1, max_in_flight=4)
    first = client.enqueue("chaos", "chaos.sleep", {"sleep_s": 0}).task_id
    wait_until(lambda: client.get_task(first).status == SUCCEEDED, 20, "the session to work")
    frozen.send(signal.SIGSTOP)
    wait_until(lambda: any(e["type"] == "WORKER_STALE" and e["worker_id"] == "w-frozen"
                           for e in chaos.events.snapshot()), 10, "WORKER_STALE for w-frozen")

    task_id = client.enqueue("chaos", "chaos.sleep", {"sleep_s": 0}).task_id
    chaos.worker(gw.target, "w-rescue", concurrency=1)

    task = check_invariant(chaos, client, [first, task_id])[task_id]
    assert (task.status, task.worker_id) == (SUCCEEDED, "w-rescue")
    assert [a.outcome for a in task.attempts] == ["succeeded"], "no attempt lost to w-frozen"


class Supervisor:
    """Restarts the chaos worker (a fresh worker id each time) whenever it dies."""

    def __init__(self, env: ChaosEnv, target: str, **worker_kwargs) -> None:
        self.env, self.target, self.kwargs = env, target, worker_kwargs
        self.generation = 0
        self.deaths = 0
        self._stop = threading.Event()
        self.current = self._spawn()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _spawn(self):
        self.generation += 1
        return self.env.worker(self.target, f"w-sup-{self.generation}", **self.kwargs)

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            if not self.current.running:
                self.deaths += 1
                self.current = self._spawn()

    def stop(self) -> None:
        """Stop restarting (the processes are cleaned up with the environment)."""
        self._stop.set()
        self._thread.join(timeout=5)


def test_poison_task_is_leased_max_attempts_times_then_dead_lettered(chaos: ChaosEnv) -> None:
    gw = chaos.gateway()
    client = chaos.client(gw.target)
    poison = client.enqueue("chaos", "chaos.poison", {}, max_attempts=3).task_id
    # Normal tasks may share a worker with the poison when it strikes (a lost attempt
    # each time), so they get a budget the three kills cannot exhaust.
    normal = [client.enqueue("chaos", "chaos.sleep", {"sleep_s": 0.05}, max_attempts=5).task_id
              for _ in range(20)]
    sup = Supervisor(chaos, gw.target, concurrency=2, max_in_flight=4)
    try:
        tasks = check_invariant(chaos, client, [poison, *normal], timeout_s=60)
    finally:
        sup.stop()

    assert all(tasks[t].status == SUCCEEDED for t in normal)
    dead = tasks[poison]
    assert dead.status == dtq_pb2.TASK_STATUS_DEAD_LETTERED
    assert dead.last_error_class == "LeaseExpired"
    assert [a.outcome for a in dead.attempts] == ["lease_expired"] * 3
    assert len(chaos.runs("start", poison)) == 3
    assert chaos.events.count("TASK_STARTED", poison) == 3
    assert sup.deaths == 3
    with grpc.insecure_channel(gw.target) as channel:
        letters = dtq_pb2_grpc.AdminStub(channel).ListDeadLetters(
            dtq_pb2.ListDeadLettersRequest(queue="chaos"), timeout=5).entries
    assert [(d.task_id, d.last_error_class, d.attempts_made) for d in letters] == [
        (poison, "LeaseExpired", 3)]


def test_cancelled_task_buffered_in_a_busy_worker_never_runs(chaos: ChaosEnv, tmp_path) -> None:
    gw = chaos.gateway()
    client = chaos.client(gw.target)
    release = tmp_path / "release"
    blocker = client.enqueue("chaos", "chaos.block", {"until_file": str(release)},
                             priority=9).task_id
    chaos.worker(gw.target, "w-busy", concurrency=1, max_in_flight=4)
    wait_until(lambda: chaos.runs("start", blocker), 20, "the blocker to start")
    others = [client.enqueue("chaos", "chaos.sleep", {"sleep_s": 0}).task_id for _ in range(3)]
    target = others[1]
    wait_until(lambda: all(client.get_task(t).status == dtq_pb2.TASK_STATUS_ACTIVE
                           for t in others), 10, "the tasks to be leased into the buffer")
    assert client.get_task(target).worker_id == "w-busy"

    answer = client.cancel(target, reason="chaos")

    assert (answer.status, answer.cancel_requested) == (dtq_pb2.TASK_STATUS_ACTIVE, True)
    wait_until(lambda: client.get_task(target).status == dtq_pb2.TASK_STATUS_CANCELLED, 10,
               f"the buffered task to be cancelled\n{chaos.logs()}")
    assert chaos.runs("start") == chaos.runs("start", blocker)  # nothing else ran meanwhile
    release.touch()
    tasks = check_invariant(chaos, client, [blocker, *others])
    assert chaos.runs("start", target) == []
    assert tasks[target].status == dtq_pb2.TASK_STATUS_CANCELLED
    assert [tasks[t].status for t in (blocker, others[0], others[2])] == [SUCCEEDED] * 3
