"""A worker of the retention proof acting over the raw dtq.v1 stubs (no SDK)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from dtq_proto import dtq_pb2 as pb
from tests.support.leasing import LeaseStream


@dataclass
class RawWorker:
    """A worker over the raw stubs: one Lease stream plus a heartbeat loop.

    Attributes:
        broker: dtq.v1.Broker stub.
        worker_id: the worker's id.
        queues: queues it leases from.
        interval_s: heartbeat period (s).
        held: leases received and not yet reported, by task id.
        cancelled: task ids the heartbeat answered as cancelled.
    """

    broker: object
    worker_id: str
    queues: list[str]
    interval_s: float
    max_in_flight: int = 500
    held: dict[str, pb.LeasedTask] = field(default_factory=dict)
    cancelled: set[str] = field(default_factory=set)
    lease: LeaseStream | None = None
    _beat: asyncio.Task | None = None

    async def start(self) -> RawWorker:
        """Open the Lease stream and start heartbeating."""
        # it may hold all it leases before acking any, so it says a concurrency that
        # makes its unread window (protocol.md 3.3) at least max_in_flight
        self.lease = await LeaseStream(self.broker, self.worker_id, self.queues,
                                       self.max_in_flight,
                                       concurrency=self.max_in_flight).open()
        self._beat = asyncio.create_task(self._beat_loop())
        return self

    async def heartbeat(self) -> pb.HeartbeatResponse:
        """One Heartbeat with every held lease; records cancelled tasks."""
        by_lease = {t.lease_id: tid for tid, t in self.held.items()}
        resp = await self.broker.Heartbeat(pb.HeartbeatRequest(
            worker_id=self.worker_id, lease_ids=list(by_lease), hostname="retention",
            active_tasks=len(by_lease), concurrency=4,
            counters=pb.WorkerCounters(tasks_processed=1)))
        self.cancelled.update(by_lease[lid] for lid in resp.cancelled_lease_ids
                              if lid in by_lease)
        return resp

    async def _beat_loop(self) -> None:
        while True:
            await self.heartbeat()
            await asyncio.sleep(self.interval_s)  # the heartbeat cadence, not a sync wait

    async def wait_leased(self, task_ids: set[str], timeout_s: float = 10.0) -> None:
        """Read the stream until every id in ``task_ids`` is held (others are kept too)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not task_ids <= set(self.held):
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"{self.worker_id}: not leased within {timeout_s}s: "
                                   f"{sorted(task_ids - set(self.held))}")
            task = await self.lease.next(timeout_s=left)
            self.held[task.task_id] = task

    async def ack(self, task_id: str, result: bytes = b'{"ok":true}') -> pb.LeaseResult:
        """Ack a held lease with ``result``; asserts the item succeeded."""
        task = self.held.pop(task_id)
        res = (await self.broker.Ack(pb.AckRequest(items=[pb.AckItem(
            lease_id=task.lease_id, result=result)]))).results[0]
        assert not res.HasField("error"), f"ack of {task_id}: {res.error}"
        return res

    async def fail(self, task_ids: list[str], **item_fields) -> list[pb.LeaseResult]:
        """Fail held leases with the same FailItem fields; asserts every item took."""
        items = [pb.FailItem(lease_id=self.held.pop(tid).lease_id, error_message="boom",
                             error_class="RetentionError", **item_fields)
                 for tid in task_ids]
        results = []
        for i in range(0, len(items), 1000):
            results += (await self.broker.Fail(pb.FailRequest(items=items[i:i + 1000]))).results
        errors = [r.error for r in results if r.HasField("error")]
        assert not errors, f"fail items refused: {errors[:3]}"
        return results

    async def stop(self) -> None:
        """Stop heartbeating and close the Lease stream."""
        if self._beat:
            self._beat.cancel()
            await asyncio.gather(self._beat, return_exceptions=True)
        if self.lease:
            self.lease.close()
