"""Many Events.Subscribe clients, some never reading, do not delay Lease, Heartbeat or Ack.

A worker drains a few hundred tasks through a gateway with 200 open Subscribe streams
(a third read everything, the rest never read). The gateway's timings are short
(visibility timeout 2 s, heartbeat 0.5 s), so a gateway that answered heartbeats or
acks late would reclaim leases (attempt > 1), refuse acks as stale, or lease a task
twice; none of that may happen.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import grpc
import pytest

from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.conftest import gateway_settings
from tests.support.leasing import poll

SUBSCRIBERS = 200
TASKS = 300
QUEUE = "fanout"


@pytest.fixture
async def gateway(redis_url: str):
    from dtq_gateway.server import Gateway

    gw = Gateway(gateway_settings(redis_url, events_max_subscribers=SUBSCRIBERS), redis_url)
    await gw.start()
    await asyncio.wait_for(gw.ops.hub.connected.wait(), 5)
    yield gw
    await gw.stop()


class Subscribers:
    """SUBSCRIBERS streams over a few channels; every third one reads."""

    def __init__(self, port: int) -> None:
        self.channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}",
                                                   options=[("dtq.test.channel", i)])
                         for i in range(10)]
        self.calls = [dtq_pb2_grpc.EventsStub(self.channels[i % 10]).Subscribe(
            pb.SubscribeRequest()) for i in range(SUBSCRIBERS)]
        self.received = Counter[int]()
        self.readers = [asyncio.create_task(self._read(i)) for i in range(0, SUBSCRIBERS, 3)]

    async def _read(self, i: int) -> None:
        try:
            async for _ in self.calls[i]:
                self.received[i] += 1
        except grpc.aio.AioRpcError:
            pass

    async def close(self) -> None:
        for call in self.calls:
            call.cancel()
        await asyncio.gather(*self.readers, return_exceptions=True)
        for ch in self.channels:
            await ch.close()


class Worker:
    """Acks every lease as soon as it arrives; heartbeats its leases every 0.1 s."""

    def __init__(self, stub: dtq_pb2_grpc.BrokerStub) -> None:
        self.stub = stub
        self.leased = Counter[str]()
        self.attempts: list[int] = []
        self.in_flight: dict[str, str] = {}
        self.acked: set[str] = set()  # task ids
        self.acked_leases: set[str] = set()
        self.stale: list[str] = []
        self.lost: set[str] = set()
        self.slowest_beat_s = 0.0

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(0.1)  # pacing of the heartbeats, not a synchronisation
            started = time.monotonic()
            reply = await self.stub.Heartbeat(pb.HeartbeatRequest(
                worker_id="w-load", lease_ids=list(self.in_flight)))
            self.slowest_beat_s = max(self.slowest_beat_s, time.monotonic() - started)
            self.lost.update(reply.lost_lease_ids)

    async def drain(self, n: int) -> None:
        call = self.stub.Lease(pb.LeaseRequest(worker_id="w-load", queues=[QUEUE],
                                               max_in_flight=50, hostname="test"))
        beater = asyncio.create_task(self._beat())
        try:
            async for msg in call:
                if not msg.HasField("task"):
                    continue
                task = msg.task
                self.leased[task.task_id] += 1
                self.attempts.append(task.attempt)
                self.in_flight[task.lease_id] = task.task_id
                try:
                    reply = await self.stub.Ack(pb.AckRequest(items=[pb.AckItem(
                        lease_id=task.lease_id)]))
                except grpc.aio.AioRpcError as exc:  # one item: its error is the call's
                    self.in_flight.pop(task.lease_id)
                    self.stale.append(exc.code().name)
                    continue
                self.in_flight.pop(task.lease_id)
                for result in reply.results:
                    if result.HasField("error"):
                        self.stale.append(result.error.reason)
                    else:
                        self.acked.add(task.task_id)
                        self.acked_leases.add(task.lease_id)
                if len(self.acked) >= n:
                    return
        finally:
            call.cancel()
            beater.cancel()


async def test_many_subscribers_do_not_delay_the_worker(gateway, channel) -> None:
    subs = Subscribers(gateway.port)
    try:
        await poll(lambda: asyncio.sleep(0, gateway.ops.hub.subscriber_count),
                   lambda n: n == SUBSCRIBERS)
        stub = dtq_pb2_grpc.BrokerStub(channel)
        for i in range(0, TASKS, 100):
            reply = await stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[
                pb.EnqueueRequest(queue=QUEUE, task_type="noop", payload=b"{}")
                for _ in range(100)]))
            assert not any(r.HasField("error") for r in reply.results)
        worker = Worker(stub)
        await asyncio.wait_for(worker.drain(TASKS), 60)
        assert len(worker.acked) == TASKS
        assert worker.stale == []
        assert set(worker.attempts) == {1}  # no lease was reclaimed
        assert max(worker.leased.values()) == 1  # no task leased twice
        assert worker.lost <= worker.acked_leases  # only leases acked while a beat ran
        assert worker.slowest_beat_s < 1.0  # well inside the 2 s visibility timeout
        assert sum(subs.received.values()) > 0
    finally:
        await subs.close()
    await poll(lambda: asyncio.sleep(0, gateway.ops.hub.subscriber_count), lambda n: n == 0)
