"""Chaos: Ack racing the reaper's reclaim, a thousand times (visibility timeout 300 ms).

A raw-stub worker leases tasks and never heartbeats; it acks each lease at a random
moment around the visibility timeout, while the reaper (every 250 ms) reclaims
whatever has been idle for 300 ms. Each Ack either wins (the task succeeds, once)
or finds its lease reclaimed (FAILED_PRECONDITION / STALE_LEASE, nothing changed)
and the task comes back as a new attempt for another race. No task may flip from
succeeded back to retrying, and a repeated Ack of a won lease is a harmless
duplicate.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

import grpc
import pytest

from dtq_proto import dtq_pb2, dtq_pb2_grpc
from tests.support.leasing import LeaseStream, error_reason
from tests.system.chaos_invariant import ChaosEnv, band_backlog, check_invariant

pytestmark = pytest.mark.chaos

TASKS = 1000
VISIBILITY_S = 0.3
#: Acks land uniformly in this window after the lease arrives (s).
ACK_WINDOW_S = (0.22, 0.45)
#: The whole race must finish within this (s).
RACE_LIMIT_S = 45.0


class Racer:
    """Acks every leased task once, at a random time around the visibility timeout."""

    def __init__(self, stub: dtq_pb2_grpc.BrokerStub, rng: random.Random) -> None:
        self.stub = stub
        self.rng = rng
        self.outcomes: Counter[str] = Counter()
        self.won: dict[str, dtq_pb2.LeasedTask] = {}
        self.all_won = asyncio.Event()
        self.late_wins = 0

    async def ack(self, task: dtq_pb2.LeasedTask) -> None:
        """Wait a random time, ack; on a win ack again and expect a duplicate."""
        delay_s = self.rng.uniform(*ACK_WINDOW_S)
        await asyncio.sleep(delay_s)
        item = dtq_pb2.AckItem(lease_id=task.lease_id, result=b"{}")
        try:
            await self.stub.Ack(dtq_pb2.AckRequest(items=[item]), timeout=10)
        except grpc.aio.AioRpcError as err:
            self.outcomes[f"{err.code().name}/{error_reason(err)}"] += 1
            return
        self.outcomes["won"] += 1
        if delay_s > VISIBILITY_S:
            self.late_wins += 1  # reclaimable already, but the reaper had not got to it
        assert task.task_id not in self.won, f"{task.task_id} acked twice with success"
        self.won[task.task_id] = task
        again = await self.stub.Ack(dtq_pb2.AckRequest(items=[item]), timeout=10)
        self.outcomes["duplicate" if again.results[0].duplicate else "repeat-not-dup"] += 1
        if len(self.won) == TASKS:
            self.all_won.set()


async def race(stream: LeaseStream, racer: Racer) -> None:
    """Ack every task the stream delivers until every task was won."""
    pending: set[asyncio.Task] = set()
    waiter = asyncio.create_task(racer.all_won.wait())
    try:
        while not racer.all_won.is_set():
            getter = asyncio.create_task(stream.tasks.get())
            done, _ = await asyncio.wait({getter, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                break
            item = getter.result()
            if isinstance(item, Exception):
                raise item
            job = asyncio.create_task(racer.ack(item))
            pending.add(job)
            job.add_done_callback(pending.discard)
    finally:
        waiter.cancel()
        for job in list(pending):
            await job


def open_statuses(client, ids: list[str]) -> Counter:
    """Count of the non-terminal statuses among ``ids``."""
    return Counter(dtq_pb2.TaskStatus.Name(t.status) for t in map(client.get_task, ids)
                   if t.status != dtq_pb2.TASK_STATUS_SUCCEEDED)


async def test_ack_racing_reclaim_never_flips_a_success(chaos: ChaosEnv) -> None:
    # the racer heartbeats without naming the leases it holds (they must expire), so
    # stream health would end its stream as not reading: off for this race
    gw = chaos.gateway(visibility_s=VISIBILITY_S, heartbeat_s=0.1,
                       extra={"lease-stall-heartbeats": "0"})
    client = chaos.client(gw.target)
    ids = []
    for _ in range(TASKS // 500):
        ids += [r.task_id for r in client.enqueue_batch(
            [{"queue": "chaos", "task_type": "chaos.race", "payload": {}, "max_attempts": 50}
             for _ in range(500)])]
    async with grpc.aio.insecure_channel(gw.target) as channel:
        stub = dtq_pb2_grpc.BrokerStub(channel)
        racer = Racer(stub, random.Random(3))
        stream = await LeaseStream(stub, "w-racer", ["chaos"], max_in_flight=250).open()
        started = time.monotonic()
        try:
            await asyncio.wait_for(race(stream, racer), RACE_LIMIT_S)
        except TimeoutError:
            raise AssertionError(
                f"race unfinished after {RACE_LIMIT_S}s: {dict(racer.outcomes)}, "
                f"won {len(racer.won)}, backlog {band_backlog(chaos.rds, 'chaos')}, "
                f"statuses {await asyncio.to_thread(open_statuses, client, ids)}\n"
                f"{chaos.logs()}") from None
        finally:
            stream.close()
        elapsed = time.monotonic() - started

    tasks = await asyncio.to_thread(check_invariant, chaos, client, ids, timeout_s=20)
    lost = racer.outcomes["FAILED_PRECONDITION/STALE_LEASE"]
    assert racer.outcomes["won"] == TASKS and racer.outcomes["duplicate"] == TASKS, racer.outcomes
    assert set(racer.outcomes) == {"won", "duplicate", "FAILED_PRECONDITION/STALE_LEASE"}
    assert lost >= 50, f"too few races lost to the reaper to prove anything: {racer.outcomes}"
    assert racer.late_wins >= 50, f"too few acks won past the visibility timeout: {racer.late_wins}"
    for tid, task in tasks.items():
        assert task.status == dtq_pb2.TASK_STATUS_SUCCEEDED
        assert task.attempt == racer.won[tid].attempt
        assert chaos.events.count("TASK_SUCCEEDED", tid) == 1
    reclaimed = sum(1 for e in chaos.events.snapshot() if e["type"] == "TASK_RETRIED")
    assert reclaimed >= lost, (reclaimed, lost)
    absorbed = sum(1 for e in chaos.events.snapshot() if e["type"] == "TASK_DUPLICATE_ABSORBED")
    print(f"race: {dict(racer.outcomes)}, late wins {racer.late_wins}, reclaims {reclaimed}, "
          f"absorbed {absorbed}, {elapsed:.1f}s")
