"""A graceful gateway restart must not run a live task twice (failing-input case 15)."""

from __future__ import annotations

import asyncio

import grpc

from dtq_gateway.server import Gateway
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.conftest import gateway_settings
from tests.support.redis_server import free_port, port_held

#: fast reconnects, as the reference workers' bounded reconnect does
CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100),
                   ("grpc.min_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 300)]


async def _heartbeat(stub, lease_id: str, stop: asyncio.Event, lost: list[str]) -> None:
    """A live worker: heartbeat its lease every 0.25 s, through outages."""
    while not stop.is_set():
        try:
            resp = await stub.Heartbeat(pb.HeartbeatRequest(worker_id="w1", lease_ids=[lease_id]),
                                        timeout=1.0)
            lost += list(resp.lost_lease_ids)
        except grpc.aio.AioRpcError:
            pass  # the gateway is restarting
        await asyncio.sleep(0.25)  # the worker's heartbeat cadence


async def test_a_live_lease_survives_a_gateway_restart_longer_than_the_timeout(redis_url):
    """Visibility timeout 2 s; the only gateway stops gracefully and comes back 2.5 s later
    on the same address; the worker heartbeats as soon as it can. The new leader's
    reaper must give it that chance instead of reclaiming the lease at once."""
    port = free_port()
    settings = gateway_settings(redis_url, listen=f"127.0.0.1:{port}")
    first = Gateway(settings, redis_url)
    await first.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS)
    stub = dtq_pb2_grpc.BrokerStub(channel)
    done = await stub.Enqueue(pb.EnqueueRequest(queue="q", task_type="t", payload=b"{}"))
    await stub.Heartbeat(pb.HeartbeatRequest(worker_id="w1"))
    call = stub.Lease(pb.LeaseRequest(worker_id="w1", queues=["q"], max_in_flight=1))
    await call.read()  # SessionInfo
    task = (await call.read()).task
    stop, lost = asyncio.Event(), []
    beats = asyncio.create_task(_heartbeat(stub, task.lease_id, stop, lost))
    await first.stop()
    with port_held(port):  # no other test's server takes the port meanwhile
        await asyncio.sleep(2.5)  # the scenario: down longer than the visibility timeout
    second = Gateway(settings, redis_url)
    await second.start()
    try:
        await asyncio.sleep(3.0)  # the scenario: the new leader's reaper has run meanwhile
        got = (await stub.GetTask(pb.GetTaskRequest(task_id=done.task_id))).task
        assert (got.status, got.attempt) == (pb.TASK_STATUS_ACTIVE, 1), \
            "the live lease was reclaimed by the new leader"
        ack = await stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=task.lease_id)]))
        assert ack.results[0].status == pb.TASK_STATUS_SUCCEEDED
        assert not lost
    finally:
        stop.set()
        await beats
        call.cancel()
        await channel.close()
        await second.stop()
