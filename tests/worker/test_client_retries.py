"""Producer clients resend read-only calls on UNAVAILABLE (grpc retry policy), and
only those: a real gateway on a real Redis is stopped and started again on its port
while calls are in flight.

Each outage test first waits until the client's channel has seen the gateway go
(TRANSIENT_FAILURE): a call made then fails its first attempt at once. The calls
start before the new gateway is created, and it listens only after its Redis
round trips, so their first attempts always meet the outage.
"""

from __future__ import annotations

import asyncio
import json
import threading

import grpc
import pytest

from dtq_gateway.server import Gateway
from dtq_proto import dtq_pb2
from dtq_pyworker import AdminClient, AsyncClient, DtqRpcError, _channel
from tests.conftest import gateway_settings
from tests.support.redis_server import free_port, port_held
from tests.worker.helpers import poll_until

#: Test-scale reconnect of the client's channel (ms): it reconnects within this long
#: once the gateway listens again, well inside the retry policy's window (3-4.5 s).
FAST_RECONNECT = [("grpc.use_local_subchannel_pool", 1),
                  ("grpc.initial_reconnect_backoff_ms", 100),
                  ("grpc.max_reconnect_backoff_ms", 200),
                  ("grpc.min_reconnect_backoff_ms", 200)]
TF = grpc.ChannelConnectivity.TRANSIENT_FAILURE


def test_retry_policy_names_the_read_only_methods():
    config = json.loads(_channel.retry_service_config())
    (method_config,) = config["methodConfig"]
    names = {(n["service"], n["method"]) for n in method_config["name"]}
    assert names == {("dtq.v1.Broker", "GetTask")} | {
        ("dtq.v1.Admin", m) for m in (
            "ListQueues", "GetQueueStats", "ListDeadLetters", "ListWorkers",
            "ListRecentTasks", "ListAudit", "GetSchedule", "ListSchedules",
            "ListRateLimits")}
    # a misspelt name would silently match nothing: each is a method of the proto
    for service, method in names:
        assert dtq_pb2.DESCRIPTOR.services_by_name[service.split(".")[-1]
                                                   ].methods_by_name[method]
    policy = method_config["retryPolicy"]
    assert policy["retryableStatusCodes"] == ["UNAVAILABLE"]
    assert policy["maxAttempts"] == 5  # grpc's cap


async def _restart(gw: Gateway, settings, redis_url: str, port: int,
                   went_down, calls) -> tuple[Gateway, list]:
    """Stop ``gw``; once ``went_down()`` holds, start ``calls()`` (awaitables), start
    a new gateway on ``port``, and return it with the calls' results or exceptions."""
    await gw.stop()
    with port_held(port):  # refused connections, and no other test takes the port
        await poll_until(went_down, 10)
        pending = [asyncio.ensure_future(c) for c in calls()]
    gw = Gateway(settings, redis_url)
    await gw.start()
    return gw, await asyncio.gather(*pending, return_exceptions=True)


async def test_async_get_task_rides_out_a_gateway_restart_and_enqueue_does_not(redis_url):
    port = free_port()
    settings = gateway_settings(redis_url, listen=f"127.0.0.1:{port}")
    gw = Gateway(settings, redis_url)
    await gw.start()
    try:
        async with AsyncClient(f"127.0.0.1:{port}", channel_options=FAST_RECONNECT) as client:
            task_id = (await client.enqueue("rt", "t", {"n": 1})).task_id
            gw, (got, enqueued) = await _restart(
                gw, settings, redis_url, port,
                lambda: client._channel.get_state(try_to_connect=True) == TF,
                lambda: [client.get_task(task_id), client.enqueue("rt", "t", {"n": 2})])
            assert not isinstance(got, BaseException), got
            assert got.task_id == task_id and got.payload == {"n": 1}
            # Enqueue is sent once: its only attempt met the outage
            assert isinstance(enqueued, DtqRpcError), enqueued
            assert enqueued.code == grpc.StatusCode.UNAVAILABLE
    finally:
        await gw.stop()


@pytest.mark.parametrize("off", [("grpc.service_config", "{}"), ("grpc.enable_retries", 0)],
                         ids=["own-service-config", "retries-off"])
async def test_channel_options_replace_or_turn_off_the_retries(redis_url, off):
    port = free_port()
    settings = gateway_settings(redis_url, listen=f"127.0.0.1:{port}")
    gw = Gateway(settings, redis_url)
    await gw.start()
    target = f"127.0.0.1:{port}"
    try:
        async with AsyncClient(target, channel_options=FAST_RECONNECT) as plain, \
                AsyncClient(target, channel_options=[*FAST_RECONNECT, off]) as bare:
            task_id = (await plain.enqueue("rt", "t", {})).task_id
            gw, (kept, lost) = await _restart(
                gw, settings, redis_url, port,
                lambda: all(c._channel.get_state(try_to_connect=True) == TF
                            for c in (plain, bare)),
                lambda: [plain.get_task(task_id), bare.get_task(task_id)])
            assert not isinstance(kept, BaseException), kept  # the same outage, retried
            assert isinstance(lost, DtqRpcError), lost
            assert lost.code == grpc.StatusCode.UNAVAILABLE
    finally:
        await gw.stop()


async def test_admin_client_lists_through_a_gateway_restart_and_pauses_once(redis_url):
    port = free_port()
    settings = gateway_settings(redis_url, listen=f"127.0.0.1:{port}")
    gw = Gateway(settings, redis_url)
    await gw.start()
    states: list[grpc.ChannelConnectivity] = []
    seen = threading.Lock()

    def on_state(state: grpc.ChannelConnectivity) -> None:
        with seen:
            states.append(state)

    def went_down() -> bool:
        # subscribing again asks the (idle) channel to connect
        admin._channel.unsubscribe(on_state)
        admin._channel.subscribe(on_state, try_to_connect=True)
        with seen:
            return TF in states

    # blocking client: its calls run in threads while the gateway serves on this loop
    admin = AdminClient(f"127.0.0.1:{port}", channel_options=FAST_RECONNECT)
    try:
        task_id = (await asyncio.to_thread(admin.enqueue, "rt", "t", {})).task_id
        admin._channel.subscribe(on_state)
        gw, (queues, task, paused) = await _restart(
            gw, settings, redis_url, port, went_down,
            lambda: [asyncio.to_thread(admin.list_queues),
                     asyncio.to_thread(admin.get_task, task_id),
                     asyncio.to_thread(admin.pause_queue, "rt")])
        assert not isinstance(queues, BaseException), queues
        assert [q.name for q in queues] == ["rt"]
        assert not isinstance(task, BaseException), task
        assert task.task_id == task_id
        # PauseQueue changes state (and is audited): sent once
        assert isinstance(paused, DtqRpcError), paused
        assert paused.code == grpc.StatusCode.UNAVAILABLE
    finally:
        admin._channel.unsubscribe(on_state)
        admin.close()
        await gw.stop()



def test_client_channels_reconnect_at_least_once_a_second(monkeypatch):
    """A retried attempt made while the channel waits out its reconnect backoff fails
    at once: the clients' channels cap that backoff at 1 s so the policy's 3-4.5 s
    window spans several reconnects; the worker's channel keeps its 5 s cap."""
    seen: list[dict] = []

    def capture(target, options=None):
        seen.append(dict(options or []))
        return object()
    monkeypatch.setattr(_channel.grpc.aio, "insecure_channel", capture)
    conn = _channel.Connection("127.0.0.1:1")
    conn.channel(aio=True, retries=True)
    conn.channel(aio=True)
    client, worker = seen
    assert client["grpc.max_reconnect_backoff_ms"] == 1000 and "grpc.service_config" in client
    assert worker["grpc.max_reconnect_backoff_ms"] == 5000
    assert "grpc.service_config" not in worker
