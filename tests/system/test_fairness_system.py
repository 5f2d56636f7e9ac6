"""Per-key concurrency across two gateway processes on one Redis (docs/fairness.md).

* Many keys, limit 2 per key, four workers on two gateways: no key ever has more than
  2 tasks running (the workers' own count, from delivery to ack, and the Redis
  ``active`` hash sampled every few ms all the way through), and a key with 10 tasks
  enqueued behind a key's backlog of 2,000 finishes within what round robin
  predicts, not after the backlog.
* A worker SIGKILLed mid-task holds its key's slot only until the reaper reclaims its
  lease; the key's parked task then runs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest

from dtq_gateway.store import keys
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.support.leasing import LeaseStream
from tests.system.chaos_invariant import ChaosEnv
from tests.system.chaos_support import wait_until

pytestmark = [pytest.mark.system, pytest.mark.chaos]

Q = "fair"
LIMIT = 2
BIG, SMALL, OTHERS = 2000, 10, 20  # backlog of key "big"; tasks of "small"; other keys
RUN_S = 0.02  # each task's work


class Tally:
    """What the workers saw: tasks running per key now, the most ever, and the order
    in which tasks finished (their keys)."""

    def __init__(self) -> None:
        self.running: Counter[str] = Counter()
        self.most: Counter[str] = Counter()
        self.done: list[str] = []


def enqueue_all(broker) -> dict[str, str]:
    """big's backlog first, then 10 tasks of each other key, then small's: task id -> key."""
    plan = ["big"] * BIG + [f"k{i:02d}" for i in range(OTHERS) for _ in range(10)] \
        + ["small"] * SMALL
    key_of = {}
    for i in range(0, len(plan), 500):
        chunk = plan[i:i + 500]
        reply = broker.EnqueueBatch(pb.EnqueueBatchRequest(items=[
            pb.EnqueueRequest(queue=Q, task_type="t", payload=b"{}", concurrency_key=k)
            for k in chunk]))
        key_of.update({r.task_id: k for r, k in zip(reply.results, chunk)})
    return key_of


async def work(target: str, worker_id: str, key_of: dict[str, str], tally: Tally,
               stop: asyncio.Event) -> None:
    """One worker: up to 5 tasks at once, each runs RUN_S, counted per key until its ack
    is sent (the gateway frees the slot only after that)."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = dtq_pb2_grpc.BrokerStub(channel)
        stream = await LeaseStream(stub, worker_id, [Q], max_in_flight=5).open()

        async def run(task: pb.LeasedTask) -> None:
            key = key_of[task.task_id]
            tally.running[key] += 1
            tally.most[key] = max(tally.most[key], tally.running[key])
            await asyncio.sleep(RUN_S)  # the task's work, not a synchronisation
            tally.running[key] -= 1
            tally.done.append(key)
            await stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=task.lease_id)]))

        runs: set[asyncio.Task] = set()
        try:
            while not stop.is_set():
                try:
                    task = await stream.next(0.2)
                except TimeoutError:
                    continue
                t = asyncio.create_task(run(task))
                runs.add(t)
                t.add_done_callback(runs.discard)
            await asyncio.gather(*runs)
        finally:
            stream.close()


def sample_active(env: ChaosEnv, stop: threading.Event, seen: list[int]) -> None:
    """Record the largest per-key active count in Redis, about every 5 ms."""
    while not stop.is_set():
        values = env.rds.hvals(keys.concurrency_active(Q))
        seen.append(max((int(v) for v in values), default=0))
        stop.wait(0.005)


async def drive(targets: list[str], key_of: dict[str, str], tally: Tally) -> None:
    stop = asyncio.Event()
    workers = [asyncio.create_task(work(t, f"fair-w{i}", key_of, tally, stop))
               for i, t in enumerate(targets + targets)]
    deadline = time.monotonic() + 240
    while len(tally.done) < len(key_of) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)  # polling the workers' progress with a deadline
    stop.set()
    await asyncio.gather(*workers)


def test_keys_stay_within_the_limit_and_a_small_key_is_not_starved(chaos: ChaosEnv) -> None:
    gws = [chaos.gateway("fair-gw-a"), chaos.gateway("fair-gw-b")]
    with grpc.insecure_channel(gws[0].target) as channel:
        dtq_pb2_grpc.AdminStub(channel).SetConcurrencyLimit(pb.SetConcurrencyLimitRequest(
            queue=Q, max_active_per_key=LIMIT))
        key_of = enqueue_all(dtq_pb2_grpc.BrokerStub(channel))
    tally, seen, stop = Tally(), [], threading.Event()
    sampler = threading.Thread(target=sample_active, args=(chaos, stop, seen), daemon=True)
    sampler.start()
    started = time.monotonic()
    try:
        asyncio.run(drive([g.target for g in gws], key_of, tally))
    finally:
        stop.set()
        sampler.join(5)
    elapsed = time.monotonic() - started
    assert len(tally.done) == len(key_of), (len(tally.done), chaos.logs())
    assert max(tally.most.values()) <= LIMIT, tally.most
    assert seen and max(seen) <= LIMIT, max(seen)
    # round robin among keys with ready work: while small's 10 tasks run (5 rounds of
    # 2), big runs at most 2 per round too; slack for the reads that park big's backlog
    small_last = max(i for i, k in enumerate(tally.done) if k == "small")
    big_before = sum(1 for k in tally.done[:small_last] if k == "big")
    print(f"{len(key_of)} tasks in {elapsed:.1f}s; {len(seen)} samples, most active per "
          f"key {max(seen)}; small finished after {big_before} of big's {BIG}")
    assert big_before <= 200, big_before
    # nothing of the keys is left in Redis
    assert not chaos.rds.exists(keys.concurrency_active(Q), keys.concurrency_waiting(Q))
    assert not chaos.rds.keys(f"dtq:conc:{{{Q}}}:parked:*")


def test_killed_worker_frees_its_keys_slot_after_reclaim(chaos: ChaosEnv, tmp_path: Path
                                                         ) -> None:
    gw = chaos.gateway("fair-kill-gw")
    client = chaos.client(gw.target)
    with grpc.insecure_channel(gw.target) as channel:
        dtq_pb2_grpc.AdminStub(channel).SetConcurrencyLimit(pb.SetConcurrencyLimitRequest(
            queue=Q, max_active_per_key=1))
    blocker = client.enqueue(Q, "chaos.block", {"until_file": str(tmp_path / "never")},
                             concurrency_key="k").task_id
    victim = chaos.worker(gw.target, "fair-victim", queue=Q)
    wait_until(lambda: chaos.runs("start", blocker), 20, "the blocking task to start")
    after = client.enqueue(Q, "chaos.sleep", {"sleep_s": 0}, concurrency_key="k").task_id
    wait_until(lambda: chaos.rds.hget(keys.concurrency_waiting(Q), "k") == "1", 10,
               "the second task of k to be parked")
    victim.kill()
    killed_at = time.monotonic()
    chaos.worker(gw.target, "fair-rescuer", queue=Q)
    wait_until(lambda: chaos.runs("done", after), 60, "the parked task to run")
    print(f"parked task ran {time.monotonic() - killed_at:.1f}s after the kill")
    assert chaos.rds.hget(keys.task(blocker), "attempt") == "2"  # reclaimed: attempt 2
