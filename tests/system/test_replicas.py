"""Gateway replicas: two gateway processes on one Redis, workers on both.

Gateways keep no state of their own (docs/operations.md, "Scaling"): a lease taken
through one replica may be extended, acked or failed through any other, the Redis
pending-entries list keeps a worker id's ``max_in_flight`` exact whichever replica
its sessions and reports go through, and the scheduler role moves to another
replica within the lock TTL when its holder is SIGKILLed.

The raw-gRPC tests share one pair of gateways (module fixture); each uses its own
queue and worker ids. The leader test starts its own pair, with dtq-pyworker
processes that reach the gateways through a client-side gRPC load balancer (a
two-address target), as workers behind a load balancer would.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from dtq_gateway.store import keys
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.support.leasing import LeaseStream, error_reason, poll
from tests.system.chaos_invariant import ChaosEnv, check_invariant
from tests.system.chaos_support import GatewayProc, wait_until

pytestmark = [pytest.mark.system, pytest.mark.slow]

#: Timings of the shared pair: leases expire 2 s after their last extension, heartbeats
#: every 0.5 s, retries after a lost lease or a failure wait at most 50 ms.
VISIBILITY_S = 2.0
HEARTBEAT_S = 0.5
SHORT_BACKOFF = {"backoff-base-ms": "50", "backoff-cap-ms": "50"}
#: The dispatcher of every replica re-reads every session at least this often (s); a
#: session that received nothing for longer than this was refused, not overlooked.
DISPATCH_TICK_S = 1.0
#: Lock TTL of the scheduler leader (ms in dtq_gateway.duties.scheduler, 10 s).
LOCK_TTL_S = 10.0
#: Followers try to take the lock every 1-2 s; allowed on top of the TTL (s).
TAKEOVER_SLACK_S = 2.5


class Replica:
    """Stubs of one gateway process, on a channel of the running test's event loop."""

    def __init__(self, gateway: GatewayProc) -> None:
        self.gateway = gateway
        self.channel = grpc.aio.insecure_channel(gateway.target)
        self.broker = dtq_pb2_grpc.BrokerStub(self.channel)
        self.admin = dtq_pb2_grpc.AdminStub(self.channel)

    async def enqueue(self, queue: str, n: int = 1, **kw) -> list[str]:
        """Enqueue ``n`` tasks (``{}`` payload); their ids."""
        items = [pb.EnqueueRequest(queue=queue, task_type="t", payload=b"{}", **kw)
                 for _ in range(n)]
        resp = await self.broker.EnqueueBatch(pb.EnqueueBatchRequest(items=items))
        assert all(not r.HasField("error") for r in resp.results), resp
        return [r.task_id for r in resp.results]

    async def ack(self, *lease_ids: str, result: bytes = b"") -> list[pb.LeaseResult]:
        """Ack the leases; one LeaseResult each."""
        resp = await self.broker.Ack(pb.AckRequest(
            items=[pb.AckItem(lease_id=lid, result=result) for lid in lease_ids]))
        return list(resp.results)

    async def task(self, task_id: str) -> pb.Task:
        """GetTask."""
        return (await self.broker.GetTask(pb.GetTaskRequest(task_id=task_id))).task

    async def held_by(self, queue: str, worker_id: str) -> int:
        """Entries of ``queue`` pending on ``worker_id`` (Admin GetQueueStats)."""
        stats = await self.admin.GetQueueStats(pb.GetQueueStatsRequest(queue=queue))
        return sum(c.pending for c in stats.consumers if c.name == worker_id)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ChaosEnv, GatewayProc,
                                                                     GatewayProc]]:
    """Two gateways (``rep-gw-a``, ``rep-gw-b``) on one private redis-server."""
    env = ChaosEnv(tmp_path_factory.mktemp("replicas"))
    try:
        a, b = (env.gateway(gid, visibility_s=VISIBILITY_S, heartbeat_s=HEARTBEAT_S,
                            extra=SHORT_BACKOFF) for gid in ("rep-gw-a", "rep-gw-b"))
        yield env, a, b
    finally:
        env.cleanup()


@pytest.fixture
async def replicas(pair) -> AsyncIterator[tuple[ChaosEnv, Replica, Replica]]:
    """The shared pair with stubs on this test's event loop."""
    env, a, b = pair
    ra, rb = Replica(a), Replica(b)
    try:
        yield env, ra, rb
    finally:
        await ra.channel.close()
        await rb.channel.close()


async def keep_extending(worker_id: str, held: set[str], via: list[Replica]) -> None:
    """Heartbeat the leases in ``held`` every HEARTBEAT_S, alternating replicas, so
    they stay the worker's however long a test holds them."""
    for n in itertools.count():
        await via[n % len(via)].broker.Heartbeat(
            pb.HeartbeatRequest(worker_id=worker_id, lease_ids=sorted(held)))
        await asyncio.sleep(HEARTBEAT_S)


def drain_now(*streams: LeaseStream) -> list[pb.LeasedTask]:
    """Tasks already delivered to the streams and not yet taken."""
    out = []
    for s in streams:
        while not s.tasks.empty():
            item = s.tasks.get_nowait()
            assert isinstance(item, pb.LeasedTask), item
            out.append(item)
    return out


async def test_heartbeat_and_ack_through_the_other_replica_complete_once(replicas) -> None:
    env, a, b = replicas
    [task_id] = await a.enqueue("rep-ack")
    lease = await LeaseStream(a.broker, "rep-w-ack", ["rep-ack"], max_in_flight=1).open()
    try:
        assert lease.session.gateway_id == "rep-gw-a"
        leased = await lease.next()
        assert leased.task_id == task_id
        # the lease is extended and completed through B, the worker's stream stays on A
        beat = await b.broker.Heartbeat(pb.HeartbeatRequest(worker_id="rep-w-ack",
                                                            lease_ids=[leased.lease_id]))
        assert not beat.lost_lease_ids
        [res] = await b.ack(leased.lease_id, result=b'{"via":"b"}')
        assert (res.status, res.duplicate, res.HasField("error")) == \
            (pb.TASK_STATUS_SUCCEEDED, False, False)
        [again] = await a.ack(leased.lease_id, result=b'{"via":"a"}')  # a repeat via A
        assert (again.status, again.duplicate, again.HasField("error")) == \
            (pb.TASK_STATUS_SUCCEEDED, True, False)
        task = await a.task(task_id)
        assert task.status == pb.TASK_STATUS_SUCCEEDED and task.result == b'{"via":"b"}'
        assert [(x.attempt, x.outcome, x.worker_id) for x in task.attempts] == \
            [(1, "succeeded", "rep-w-ack")]
        wait_until(lambda: env.events.count("TASK_SUCCEEDED", task_id), 5, "TASK_SUCCEEDED")
        assert env.events.count("TASK_SUCCEEDED", task_id) == 1
        assert await a.held_by("rep-ack", "rep-w-ack") == 0
    finally:
        lease.close()


async def test_stale_ack_through_the_other_replica_after_reclaim_is_refused(replicas) -> None:
    env, a, b = replicas
    [task_id] = await b.enqueue("rep-stale", max_attempts=3)
    slow = await LeaseStream(a.broker, "rep-w-slow", ["rep-stale"], max_in_flight=1,
                             heartbeat=False).open()
    first = await slow.next()
    slow.close()  # the worker goes silent while holding the lease: it expires
    await poll(lambda: a.task(task_id),
               lambda t: t.attempts and t.attempts[0].outcome == "lease_expired",
               timeout_s=VISIBILITY_S + 5)
    fresh = await LeaseStream(b.broker, "rep-w-fresh", ["rep-stale"], max_in_flight=1).open()
    try:
        second = await fresh.next(timeout_s=5)
        assert (second.task_id, second.attempt) == (task_id, 2)
        # the silent worker's late Ack through B: alone in its call, the call fails
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await b.ack(first.lease_id, result=b'"stale"')
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_reason(refused.value) == "STALE_LEASE"
        assert (await a.task(task_id)).status == pb.TASK_STATUS_ACTIVE
        # through A, batched with the current lease (leased via B): refused item by item
        stale, ok = await a.ack(first.lease_id, second.lease_id, result=b'"fresh"')
        assert stale.error.reason == "STALE_LEASE", stale
        assert stale.error.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
        assert ok.status == pb.TASK_STATUS_SUCCEEDED and not ok.HasField("error")
    finally:
        fresh.close()
    task = await b.task(task_id)
    assert task.result == b'"fresh"'
    assert [(x.attempt, x.outcome, x.worker_id) for x in task.attempts] == \
        [(1, "lease_expired", "rep-w-slow"), (2, "succeeded", "rep-w-fresh")]
    wait_until(lambda: env.events.count("TASK_SUCCEEDED", task_id), 5, "TASK_SUCCEEDED")
    assert env.events.count("TASK_SUCCEEDED", task_id) == 1


async def test_max_in_flight_holds_across_replicas(replicas) -> None:
    """One worker id, a session on each replica, max_in_flight 2: the two sessions
    together never hold more than 2 leases, and an Ack through either replica frees
    exactly one lease's worth of credit for both."""
    _env, a, b = replicas
    worker, queue = "rep-w-mif", "rep-mif"
    await a.enqueue(queue, 5)
    held: set[str] = set()
    beater = asyncio.create_task(keep_extending(worker, held, [b, a]))
    on_a = await LeaseStream(a.broker, worker, [queue], max_in_flight=2,
                             heartbeat=False).open()
    on_b = None
    try:
        held.update(t.lease_id for t in await on_a.take(2))
        # the same worker id reconnects through B while it holds 2 leases taken via A
        on_b = await LeaseStream(b.broker, worker, [queue], max_in_flight=2,
                                 heartbeat=False).open()
        assert on_b.session.gateway_id == "rep-gw-b"
        await asyncio.sleep(DISPATCH_TICK_S * 1.5)  # a full dispatch round on each replica
        assert drain_now(on_a, on_b) == []
        assert await b.held_by(queue, worker) == 2

        # both leases acked via B: exactly two more, to either session, then nothing
        results = await b.ack(*sorted(held))
        assert [r.status for r in results] == [pb.TASK_STATUS_SUCCEEDED] * 2
        held.clear()
        got: list[pb.LeasedTask] = []
        await poll(lambda: _gather(on_a, on_b, got), lambda g: len(g) >= 2, timeout_s=5)
        held.update(t.lease_id for t in got)
        await asyncio.sleep(DISPATCH_TICK_S * 1.5)
        assert drain_now(on_a, on_b) == [] and len(got) == 2, got
        assert await a.held_by(queue, worker) == 2

        # one acked via A: the fifth task, and the queue is empty
        await a.ack(got[0].lease_id)
        held.discard(got[0].lease_id)
        last: list[pb.LeasedTask] = []
        await poll(lambda: _gather(on_a, on_b, last), lambda g: len(g) >= 1, timeout_s=5)
        assert len(last) == 1, last
        await a.ack(got[1].lease_id, last[0].lease_id)
        held.clear()
    finally:
        beater.cancel()
        on_a.close()
        if on_b is not None:
            on_b.close()
    stats = await a.admin.GetQueueStats(pb.GetQueueStatsRequest(queue=queue))
    assert (stats.depth, stats.pending) == (0, 0)


async def _gather(s1: LeaseStream, s2: LeaseStream,
                  acc: list[pb.LeasedTask]) -> list[pb.LeasedTask]:
    """Append what the two streams delivered so far to ``acc``; return it."""
    acc.extend(drain_now(s1, s2))
    return acc


def lock_holder(env: ChaosEnv) -> str | None:
    """Gateway id named by the scheduler lock (its value is ``<gateway_id>:<token>``)."""
    value = env.rds.get(keys.SCHEDULER_LOCK)
    return value.rpartition(":")[0] if value else None


def test_leader_sigkilled_other_replica_moves_due_tasks_within_lock_ttl(
        tmp_path: Path) -> None:
    """Workers on both replicas behind a client-side load balancer; the scheduler
    leader is SIGKILLed while delayed tasks and retries wait; the other replica takes
    the lock within its TTL and every task still runs exactly once, never early."""
    env = ChaosEnv(tmp_path)
    try:
        gws = [env.gateway(gid, visibility_s=3.0, heartbeat_s=0.5)
               for gid in ("rep-lead-a", "rep-lead-b")]
        leader_id = wait_until(lambda: lock_holder(env), 15, "a scheduler leader")
        leader = next(g for g in gws if g.gateway_id == leader_id)
        follower = next(g for g in gws if g is not leader)
        # each worker prefers one replica (pick_first) and fails over to the other
        for name, first, second in (("rep-w-leader", leader, follower),
                                    ("rep-w-follower", follower, leader)):
            env.worker(f"ipv4:{first.target},{second.target}", name, concurrency=4)
        client = env.client(follower.target)
        delays_ms = [300 + i * 1000 for i in range(13)]  # due before, during and after
        delayed = {client.enqueue("chaos", "chaos.sleep", {"sleep_s": 0},
                                  delay_ms=d).task_id: d for d in delays_ms}
        retried = [client.enqueue("chaos", "chaos.fail_once", {"retry_after_s": 2.0}).task_id
                   for _ in range(6)]
        wait_until(lambda: all(client.get_task(t).status == pb.TASK_STATUS_SCHEDULED
                               and client.get_task(t).attempt == 2 for t in retried), 15,
                   "every fail_once task to wait for its retry")

        leader.kill()
        killed_at, killed_at_ms = time.monotonic(), int(time.time() * 1000)
        left_s = env.rds.pttl(keys.SCHEDULER_LOCK) / 1000  # what the dead leader had left
        wait_until(lambda: lock_holder(env) == follower.gateway_id,
                   LOCK_TTL_S + TAKEOVER_SLACK_S, "the follower to take the scheduler lock")
        takeover_s = time.monotonic() - killed_at

        tasks = check_invariant(env, client, [*delayed, *retried], timeout_s=30)
        assert 0 < left_s <= LOCK_TTL_S
        assert left_s - 0.5 <= takeover_s <= left_s + TAKEOVER_SLACK_S, (left_s, takeover_s)
        assert all(t.status == pb.TASK_STATUS_SUCCEEDED for t in tasks.values())
        for tid, delay_ms in delayed.items():
            assert len(env.runs("start", tid)) == 1, env.runs(task_id=tid)
            assert tasks[tid].started_at_ms >= tasks[tid].created_at_ms + delay_ms
        for tid in retried:
            assert [r["attempt"] for r in env.runs("start", tid)] == [1, 2]
            first, second = tasks[tid].attempts
            assert second.started_at_ms >= first.finished_at_ms + 2000
        after_kill = {t.worker_id for t in tasks.values() if t.started_at_ms > killed_at_ms}
        # the killed replica's worker carried on through the other one
        assert after_kill == {"rep-w-leader", "rep-w-follower"}, after_kill
        print(f"scheduler lock taken over {takeover_s:.1f}s after the leader was killed "
              f"({left_s:.1f}s of its {LOCK_TTL_S:.0f}s TTL were left)")
    finally:
        env.cleanup()
