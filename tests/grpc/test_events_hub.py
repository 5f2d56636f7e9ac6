"""EventsHub: one shared subscriber, bounded fan-out, filters, resubscribe after restart.

Events are published straight to the channel with redis-py, as the Lua scripts do.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

import pytest
import redis.asyncio as aioredis

from dtq_gateway.events.events_hub import EventsHub, Subscription
from dtq_gateway.store import keys

POLL_S = 0.05  # interval of the deadline-bounded polls of the hub's counters


def ev(n: int, type_: str = "TASK_QUEUED", queue: str = "q1") -> str:
    return json.dumps({"event_id": f"e{n}", "ts": "2026-01-01T00:00:00.000Z", "type": type_,
                       "task_id": f"t{n}", "queue": queue, "task_type": "x", "attempt": 1,
                       "worker_id": ""})


async def take(sub: Subscription, n: int, timeout_s: float = 5.0) -> list[tuple[dict, int]]:
    out = []
    for _ in range(n):
        item = await asyncio.wait_for(sub.get(), timeout_s)
        assert item is not None
        out.append(item)
    return out


@pytest.fixture
async def client(redis_url: str):
    c = aioredis.from_url(redis_url)
    yield c
    await c.aclose()


@pytest.fixture
async def hub(client: aioredis.Redis):
    h = EventsHub(client, buffer_size=1000)
    h.start()
    await asyncio.wait_for(h.connected.wait(), 5)
    yield h
    await h.stop()


async def test_fan_out_to_subscribers_and_listeners(hub: EventsHub, client) -> None:
    a, b = hub.subscribe(), hub.subscribe()
    seen: list[str] = []
    hub.add_listener(lambda e: seen.append(e["event_id"]))
    for n in range(3):
        await client.publish(keys.EVENTS_CHANNEL, ev(n))
    for sub in (a, b):
        got = await take(sub, 3)
        assert [(e["event_id"], d) for e, d in got] == [("e0", 0), ("e1", 0), ("e2", 0)]
    assert seen == ["e0", "e1", "e2"]
    assert await client.pubsub_numsub(keys.EVENTS_CHANNEL) == [(keys.EVENTS_CHANNEL.encode(), 1)]


async def test_filters_by_queue_and_type(hub: EventsHub, client) -> None:
    by_queue = hub.subscribe(queues=["q2"])
    by_type = hub.subscribe(types=["TASK_FAILED"])
    await client.publish(keys.EVENTS_CHANNEL, ev(1, "TASK_QUEUED", "q1"))
    await client.publish(keys.EVENTS_CHANNEL, ev(2, "TASK_FAILED", "q1"))
    await client.publish(keys.EVENTS_CHANNEL, ev(3, "TASK_QUEUED", "q2"))
    await client.publish(keys.EVENTS_CHANNEL, ev(4, "WORKER_STARTED", ""))
    assert [e["event_id"] for e, _ in await take(by_queue, 1)] == ["e3"]
    assert [e["event_id"] for e, _ in await take(by_type, 1)] == ["e2"]
    marker = hub.subscribe()
    await client.publish(keys.EVENTS_CHANNEL, ev(5, "TASK_QUEUED", "q9"))
    await take(marker, 1)  # e5 was dispatched: anything before it was too
    for sub in (by_queue, by_type):
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(sub.get(), 0.05)


async def test_slow_subscriber_loses_events_and_is_told(client) -> None:
    hub = EventsHub(client, buffer_size=5)
    hub.start()
    try:
        await asyncio.wait_for(hub.connected.wait(), 5)
        slow, fast = hub.subscribe(), hub.subscribe(buffer_size=1000)
        fast_got: list[str] = []

        async def drain_fast() -> None:
            while len(fast_got) < 21:
                event, dropped = await fast.get()
                assert dropped == 0
                fast_got.append(event["event_id"])

        reader = asyncio.create_task(drain_fast())
        for n in range(20):
            await client.publish(keys.EVENTS_CHANNEL, ev(n))
        deadline = time.monotonic() + 5
        while len(fast_got) < 20 and not reader.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # poll: the fast reader has seen e0..e19
        first = await take(slow, 5)  # the buffer held e0..e4; e5..e19 were dropped
        assert [(e["event_id"], d) for e, d in first] == [(f"e{n}", 0) for n in range(5)]
        await client.publish(keys.EVENTS_CHANNEL, ev(99))
        await asyncio.wait({reader}, timeout=5)
        assert reader.done(), fast_got
        assert fast_got == [f"e{n}" for n in range(20)] + ["e99"]
        [(event, dropped)] = await take(slow, 1)
        assert (event["event_id"], dropped) == ("e99", 15)
        assert slow.dropped_total == 15 and fast.dropped_total == 0
    finally:
        await hub.stop()


async def test_stop_ends_subscriptions(client) -> None:
    hub = EventsHub(client)
    hub.start()
    await asyncio.wait_for(hub.connected.wait(), 5)
    sub = hub.subscribe()
    await hub.stop()
    assert await asyncio.wait_for(sub.get(), 1) is None
    assert await asyncio.wait_for(hub.subscribe().get(), 1) is None  # after stop


async def test_malformed_messages_are_ignored(hub: EventsHub, client) -> None:
    sub = hub.subscribe()
    await client.publish(keys.EVENTS_CHANNEL, b"not json")
    await client.publish(keys.EVENTS_CHANNEL, b"[1, 2]")
    await client.publish(keys.EVENTS_CHANNEL, ev(1))
    assert [e["event_id"] for e, _ in await take(sub, 1)] == ["e1"]


async def test_resubscribes_after_redis_restart(own_redis) -> None:
    client = aioredis.from_url(own_redis.url, socket_timeout=2, socket_connect_timeout=1)
    publisher = aioredis.from_url(own_redis.url)
    hub = EventsHub(client, max_backoff_s=0.5)
    hub.start()
    try:
        await asyncio.wait_for(hub.connected.wait(), 5)
        sub = hub.subscribe()
        await asyncio.get_running_loop().run_in_executor(None, own_redis.restart)
        # Publish until the hub hears us: proves it is subscribed again by itself.
        deadline = time.monotonic() + 15
        received = None
        n = 0
        while received is None and time.monotonic() < deadline:
            n += 1
            try:
                await publisher.publish(keys.EVENTS_CHANNEL, ev(n))
            except (aioredis.ConnectionError, OSError):
                pass
            try:
                received = await asyncio.wait_for(sub.get(), 0.2)
            except TimeoutError:
                continue
        assert received is not None, "no event delivered after the restart"
        assert hub.connected.is_set()
    finally:
        await hub.stop()
        await client.aclose()
        await publisher.aclose()


async def test_silent_connection_is_dropped_and_events_flow_again(own_redis) -> None:
    """A subscription that goes silent without an error (here: redis-server SIGSTOPped,
    so the PING gets no PONG) is dropped by the watchdog; events flow again after."""
    client = aioredis.from_url(own_redis.url, socket_timeout=1, socket_connect_timeout=1)
    publisher = aioredis.from_url(own_redis.url)
    hub = EventsHub(client, max_backoff_s=0.2, idle_ping_s=0.2, pong_timeout_s=0.3)
    hub.start()
    try:
        await asyncio.wait_for(hub.connected.wait(), 5)
        sub = hub.subscribe()
        own_redis.proc.send_signal(signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 10
            while hub.silent_drops == 0 and time.monotonic() < deadline:
                await asyncio.sleep(POLL_S)
        finally:
            own_redis.proc.send_signal(signal.SIGCONT)
        assert hub.silent_drops >= 1
        deadline = time.monotonic() + 15
        received, n = None, 0
        while received is None and time.monotonic() < deadline:
            n += 1
            await publisher.publish(keys.EVENTS_CHANNEL, ev(n))
            try:
                received = await asyncio.wait_for(sub.get(), 0.2)
            except TimeoutError:
                continue
        assert received is not None, "no event delivered after the silent period"
    finally:
        await hub.stop()
        await client.aclose()
        await publisher.aclose()


async def test_idle_healthy_subscription_is_kept(client) -> None:
    """PINGs on an idle but healthy subscription get their PONG: no reconnect."""
    hub = EventsHub(client, idle_ping_s=0.1, pong_timeout_s=0.5)
    hub.start()
    try:
        await asyncio.wait_for(hub.connected.wait(), 5)
        sub = hub.subscribe()
        deadline = time.monotonic() + 10
        while hub.pings < 4 and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        assert hub.pings >= 4  # the 4th PING is only sent once the 3rd got its PONG
        assert hub.silent_drops == 0 and hub.subscribe_count == 1
        await client.publish(keys.EVENTS_CHANNEL, ev(1))
        assert [e["event_id"] for e, _ in await take(sub, 1)] == ["e1"]
    finally:
        await hub.stop()


def batch(*events: list, prefix: str = "ab" * 12, ts_ms: int = 1796062800123) -> str:
    return json.dumps({"ts_ms": ts_ms, "id_prefix": prefix, "events": list(events)})


async def test_batch_and_single_messages_reach_everyone_in_order(hub: EventsHub, client) -> None:
    """A batch message is decoded once and expands to one event per element; the raw
    pre-filter of a listener is asked once per message; old single events still work."""
    failed_only = hub.subscribe(types=["TASK_FAILED"])
    everything = hub.subscribe()
    asked: list[bytes] = []
    seen: list[dict] = []
    hub.add_listener(seen.append, lambda raw: asked.append(raw) or True)
    await client.publish(keys.EVENTS_CHANNEL, batch(
        ["TASK_QUEUED", "t1", "q1", "x", 1, "", None],
        ["TASK_FAILED", "t1", "q1", "x", 1, "w1", {"error": "boom", "error_class": "E"}],
        ["TASK_RETRY_SCHEDULED", "t1", "q1", "x", 2, "w1", None]))
    await client.publish(keys.EVENTS_CHANNEL, ev(7, "TASK_FAILED"))
    got = [e for e, _ in await take(everything, 4)]
    assert [e["event_id"] for e in got] == ["ab" * 12 + "00000001", "ab" * 12 + "00000002",
                                            "ab" * 12 + "00000003", "e7"]
    assert got[1] == {"event_id": "ab" * 12 + "00000002", "ts": "2026-11-30T18:20:00.123Z",
                      "type": "TASK_FAILED", "task_id": "t1", "queue": "q1", "task_type": "x",
                      "attempt": 1, "worker_id": "w1",
                      "metadata": {"error": "boom", "error_class": "E"}}
    assert [e["event_id"][-2:] for e, _ in await take(failed_only, 2)] == ["02", "e7"]
    assert seen == got and len(asked) == 2


async def test_message_nobody_wants_is_not_decoded(hub: EventsHub, client, caplog) -> None:
    asked: list[bytes] = []
    hub.add_listener(lambda e: None, lambda raw: asked.append(raw) and False)
    await client.publish(keys.EVENTS_CHANNEL, b"not json")
    await poll_until(lambda: len(asked) == 1)
    assert "malformed" not in caplog.text  # dropped before decoding
    hub.subscribe()
    await client.publish(keys.EVENTS_CHANNEL, b"not json either")
    await poll_until(lambda: "malformed" in caplog.text)


async def test_budget_drops_are_told_to_the_subscriber(client) -> None:
    """Beyond the delivery budget an event is dropped for the subscriber and counted;
    the next delivered event carries the count."""
    hub = EventsHub(client, max_deliveries_per_s=2)
    now = [0.0]
    hub.fanout.budget.clock = lambda: now[0]
    hub.fanout.budget._at = 0.0
    hub.start()
    try:
        await asyncio.wait_for(hub.connected.wait(), 5)
        sub = hub.subscribe()
        await client.publish(keys.EVENTS_CHANNEL, batch(
            *[["TASK_QUEUED", f"t{n}", "q1", "x", 1, "", None] for n in range(1, 6)]))
        first = await take(sub, 2)
        assert [(e["task_id"], d) for e, d in first] == [("t1", 0), ("t2", 0)]
        now[0] = 1.0  # the budget refills
        await client.publish(keys.EVENTS_CHANNEL, ev(6))
        [(event, dropped)] = await take(sub, 1)
        assert (event["event_id"], dropped, sub.dropped_total) == ("e6", 3, 3)
    finally:
        await hub.stop()


async def test_subscriber_cap(client) -> None:
    from dtq_gateway.errors import SubscriberLimit

    hub = EventsHub(client, max_subscribers=1)
    first = hub.subscribe()
    with pytest.raises(SubscriberLimit):
        hub.subscribe()
    hub.unsubscribe(first)
    hub.subscribe()
    await hub.stop()


async def poll_until(pred, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(POLL_S)
