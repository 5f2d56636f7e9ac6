"""Periodic schedules and rate limits across two gateway processes on one Redis.

* A schedule fires exactly once per period while the scheduler leader is SIGKILLed:
  the fires due while no replica led (up to the lock TTL, 10 s) are enqueued late by
  the new leader, each once (the fire time is the task's idempotency key).
* A rate limit of 20 leases/s holds across both gateways: leases measured over 10 s
  (Redis clock, ``leased_at_ms``) are within 10 % of 200.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from dtq_gateway.store import keys
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.support.leasing import LeaseStream
from tests.system.chaos_invariant import ChaosEnv
from tests.system.chaos_support import wait_until

pytestmark = [pytest.mark.system, pytest.mark.chaos]

LOCK_TTL_S = 10.0
TAKEOVER_SLACK_S = 2.5


def lock_holder(env: ChaosEnv) -> str | None:
    value = env.rds.get(keys.SCHEDULER_LOCK)
    return value.rpartition(":")[0] if value else None


def fires(env: ChaosEnv, name: str) -> list[int]:
    """Fire times (epoch ms) of every task the schedule enqueued, one entry per task."""
    out = []
    for tid in env.rds.zrange(keys.RECENT_TASKS, 0, -1):
        idem = env.rds.hget(keys.task(tid), "idem_key") or ""
        if idem.startswith(f"schedule:{name}:"):
            out.append(int(idem.rsplit(":", 1)[1]))
    return sorted(out)


def test_schedule_fires_once_per_period_across_a_leader_kill(chaos: ChaosEnv) -> None:
    gateways = {g.gateway_id: g for g in (chaos.gateway("sched-gw-a"),
                                           chaos.gateway("sched-gw-b"))}
    leader_id = wait_until(lambda: lock_holder(chaos), 15, "a scheduler leader")
    leader = gateways.pop(leader_id)
    follower = next(iter(gateways.values()))
    with grpc.insecure_channel(follower.target) as channel:
        admin = dtq_pb2_grpc.AdminStub(channel)
        created = admin.CreateSchedule(pb.CreateScheduleRequest(schedule=pb.Schedule(
            name="beat", interval_ms=1000,
            task=pb.EnqueueRequest(queue="sched", task_type="beat", payload=b"{}"))))
        anchor = created.schedule.created_at_ms
        wait_until(lambda: len(fires(chaos, "beat")) >= 2, 10, "two fires before the kill")

        leader.kill()
        killed_at = time.monotonic()
        wait_until(lambda: lock_holder(chaos) == follower.gateway_id,
                   LOCK_TTL_S + TAKEOVER_SLACK_S, "the follower to take the scheduler lock")
        taken_over = len(fires(chaos, "beat"))
        wait_until(lambda: len(fires(chaos, "beat")) >= taken_over + 2, 10,
                   "two fires after the takeover")
        info = admin.GetSchedule(pb.GetScheduleRequest(name="beat")).schedule

    got = fires(chaos, "beat")
    # every period from the first fire to the last became exactly one task: none lost
    # while no replica led, none doubled by the new leader
    assert got == [anchor + 1000 * k for k in range(1, len(got) + 1)], got
    assert info.fires_total == len(got) and info.last_fire_ms == got[-1]
    print(f"takeover after {time.monotonic() - killed_at:.1f}s; {len(got)} fires, each once")


async def _lease_and_ack(target: str, worker_id: str, until: float) -> list[int]:
    """Lease from ``target`` and ack at once until ``until`` (monotonic); leased_at_ms."""
    leased: list[int] = []
    async with grpc.aio.insecure_channel(target) as channel:
        stub = dtq_pb2_grpc.BrokerStub(channel)
        stream = await LeaseStream(stub, worker_id, ["rate"], max_in_flight=20).open()
        try:
            while time.monotonic() < until:
                try:
                    task = await stream.next(max(0.05, until - time.monotonic()))
                except TimeoutError:
                    break
                leased.append(task.leased_at_ms)
                await stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=task.lease_id)]))
        finally:
            stream.close()
    return leased


async def _run_workers(targets: list[str], seconds: float) -> list[int]:
    until = time.monotonic() + seconds
    parts = await asyncio.gather(*(_lease_and_ack(t, f"rate-w{i}", until)
                                   for i, t in enumerate(targets)))
    return sorted(ms for part in parts for ms in part)


def test_rate_limit_of_20_per_second_holds_across_two_gateways(chaos: ChaosEnv) -> None:
    gws = [chaos.gateway("rate-gw-a"), chaos.gateway("rate-gw-b")]
    with grpc.insecure_channel(gws[0].target) as channel:
        admin = dtq_pb2_grpc.AdminStub(channel)
        admin.SetRateLimit(pb.SetRateLimitRequest(rate_limit=pb.RateLimit(
            queue="rate", limit=20, period_ms=1000)))
        broker = dtq_pb2_grpc.BrokerStub(channel)
        broker.EnqueueBatch(pb.EnqueueBatchRequest(items=[
            pb.EnqueueRequest(queue="rate", task_type="t", payload=b"{}")
            for _ in range(400)]))
    leased = asyncio.run(_run_workers([g.target for g in gws], 12.0))
    start = leased[0] + 1000  # after the initial burst (a full bucket of 20)
    in_window = sum(1 for ms in leased if start <= ms < start + 10_000)
    print(f"{in_window} leases in 10 s across two gateways (limit 20/s)")
    assert 180 <= in_window <= 220, in_window
    assert sum(1 for ms in leased if ms < leased[0] + 1000) <= 20 + 20 + 2  # burst + refill
