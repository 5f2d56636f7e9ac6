"""Lease sessions announce themselves: WORKER_STARTED and WORKER_STOPPED on Events."""

from __future__ import annotations

import asyncio

from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.support.leasing import LeaseStream, poll


async def test_session_start_and_end_are_events(channel, broker_stub, gateway):
    events = dtq_pb2_grpc.EventsStub(channel)
    call = events.Subscribe(pb.SubscribeRequest(types=[pb.EVENT_TYPE_WORKER_STARTED,
                                                       pb.EVENT_TYPE_WORKER_STOPPED]))
    await asyncio.wait_for(gateway.ops.hub.connected.wait(), 5)

    async def subscribers() -> int:
        return gateway.ops.hub.subscriber_count

    await poll(subscribers, lambda n: n > 0, timeout_s=5)  # the Subscribe call is registered
    lease = await LeaseStream(broker_stub, "w-events", ["q"]).open()
    it = call.__aiter__()
    started = await asyncio.wait_for(it.__anext__(), 5)
    assert (started.type, started.worker_id) == (pb.EVENT_TYPE_WORKER_STARTED, "w-events")
    lease.close()
    stopped = await asyncio.wait_for(it.__anext__(), 5)
    assert (stopped.type, stopped.worker_id) == (pb.EVENT_TYPE_WORKER_STOPPED, "w-events")
    call.cancel()
