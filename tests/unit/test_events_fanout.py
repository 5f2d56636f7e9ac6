"""FanOut: filter groups, one encoding per event, the delivery budget, the subscriber cap."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY

from dtq_gateway.errors import SubscriberLimit
from dtq_gateway.events.events_fanout import DeliveryBudget, FanOut, Subscription
from dtq_gateway.rpc.events_servicer import encode_event, with_dropped
from dtq_proto import dtq_pb2 as pb


def ev(n: int, type_: str = "TASK_QUEUED", queue: str = "q1") -> dict:
    return {"event_id": f"e{n}", "ts": "2026-01-01T00:00:00.000Z", "type": type_,
            "task_id": f"t{n}", "queue": queue, "task_type": "x", "attempt": 1, "worker_id": ""}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def buffered(sub: Subscription) -> list[tuple]:
    return list(sub._buffer)


def metric(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def test_encodes_once_per_event_for_every_subscriber() -> None:
    calls: list[str] = []

    def encode(event: dict) -> bytes:
        calls.append(event["event_id"])
        return event["event_id"].encode()

    fan = FanOut(encode)
    subs = [Subscription() for _ in range(50)] + [Subscription(queues=["q1"])
                                                  for _ in range(50)]
    for sub in subs:
        fan.add(sub)
    fan.deliver(ev(1))
    fan.deliver(ev(2, queue="q2"))
    assert calls == ["e1", "e2"]
    assert all(buffered(s) == [(b"e1", 0), (b"e2", 0)] for s in subs[:50])
    assert all(buffered(s) == [(b"e1", 0)] for s in subs[50:])
    assert buffered(subs[0])[0][0] is buffered(subs[99])[0][0]  # the same bytes object


def test_filters_before_encoding() -> None:
    calls: list[dict] = []
    fan = FanOut(lambda e: calls.append(e) or b"x")
    fan.add(Subscription(queues=["q2"], types=["TASK_FAILED"]))
    fan.deliver(ev(1, "TASK_FAILED", "q1"))
    fan.deliver(ev(2, "TASK_QUEUED", "q2"))
    assert calls == []
    fan.deliver(ev(3, "TASK_FAILED", "q2"))
    assert len(calls) == 1


def test_events_the_encoder_cannot_represent_are_not_delivered_nor_counted() -> None:
    fan = FanOut(encode_event, event_types={"TASK_QUEUED"}, deliveries_per_s=1,
                 clock=Clock())
    sub = Subscription()
    fan.add(sub)
    fan.deliver(ev(1, "NOT_A_TYPE"))
    fan.deliver(ev(2))
    assert [pb.SubscribeResponse.FromString(b).event_id for b, _ in buffered(sub)] == ["e2"]
    assert sub.dropped_total == 0


def test_raw_prefilter_skips_messages_no_subscription_can_want() -> None:
    fan = FanOut()
    assert not fan.wants_raw(b'{"type":"TASK_FAILED"}')  # no subscriptions
    typed = Subscription(types=["TASK_FAILED"])
    fan.add(typed)
    assert not fan.wants_raw(b'{"events":[["TASK_QUEUED","t","q","x",1,"",null]]}')
    assert fan.wants_raw(b'{"events":[["TASK_QUEUED"],["TASK_FAILED","t"]]}')
    everything = Subscription()
    fan.add(everything)
    assert fan.wants_raw(b'{"events":[["TASK_QUEUED"]]}')
    fan.remove(everything)
    assert not fan.wants_raw(b'{"events":[["TASK_QUEUED"]]}')


def test_budget_refills_per_second_up_to_one_second() -> None:
    clock = Clock()
    budget = DeliveryBudget(10, clock)
    assert (budget.take(4), budget.take(10), budget.take(1)) == (4, 6, 0)
    clock.now += 0.25
    assert budget.take(10) == 2
    clock.now += 60
    assert budget.take(100) == 10


def test_budget_drops_rotate_and_are_reported() -> None:
    clock = Clock()
    fan = FanOut(lambda e: e["event_id"], deliveries_per_s=10, clock=clock)
    subs = [Subscription() for _ in range(4)]
    for sub in subs:
        fan.add(sub)
    dropped_before = metric("dtq_events_dropped_total")
    for n in range(4):  # 16 deliveries wanted, 10 granted: e0, e1 to all, e2 to two
        fan.deliver(ev(n))
    got = [[item for item, _ in buffered(s)] for s in subs]
    assert got[0] == got[1] == ["e0", "e1", "e2"] and got[2] == got[3] == ["e0", "e1"]
    assert [s.dropped_total for s in subs] == [1, 1, 2, 2]
    assert metric("dtq_events_dropped_total") - dropped_before == 6
    clock.now += 0.2  # two tokens: the last event's losers start the next share
    fan.deliver(ev(9))
    assert [buffered(s)[-1] for s in subs[2:]] == [("e9", 2), ("e9", 2)]
    assert [buffered(s)[-1][0] for s in subs[:2]] == ["e2", "e2"]
    assert [s.dropped_total for s in subs] == [2, 2, 2, 2]


def test_full_buffer_drops_newest_and_counts() -> None:
    fan = FanOut(lambda e: e["event_id"])
    small, big = Subscription(maxsize=2), Subscription(maxsize=100)
    fan.add(small)
    fan.add(big)
    for n in range(5):
        fan.deliver(ev(n))
    assert buffered(small) == [("e0", 0), ("e1", 0)]
    small._buffer.clear()
    fan.deliver(ev(5))
    assert buffered(small) == [("e5", 3)] and small.dropped_total == 3
    assert len(buffered(big)) == 6 and big.dropped_total == 0


def test_subscriber_cap() -> None:
    fan = FanOut(max_subscribers=2)
    refused = metric("dtq_events_subscriptions_refused_total")
    limit = REGISTRY.get_sample_value("dtq_limit_refusals_total",
                                      {"limit": "events_max_subscribers"}) or 0
    gauge = metric("dtq_events_subscribers")
    a, b = Subscription(), Subscription()
    fan.add(a)
    fan.add(b)
    assert metric("dtq_events_subscribers") - gauge == 2
    with pytest.raises(SubscriberLimit) as exc:
        fan.add(Subscription())
    assert exc.value.reason == "TOO_MANY_SUBSCRIBERS"
    assert "DTQ_EVENTS_MAX_SUBSCRIBERS" in exc.value.message
    assert metric("dtq_events_subscriptions_refused_total") - refused == 1
    assert REGISTRY.get_sample_value("dtq_limit_refusals_total",
                                     {"limit": "events_max_subscribers"}) - limit == 1
    fan.remove(a)
    fan.remove(a)  # idempotent
    fan.add(Subscription())
    fan.close_all()
    assert len(fan) == 0 and b.closed
    assert metric("dtq_events_subscribers") == gauge


async def test_get_batch_takes_everything_buffered_and_ends_after_close() -> None:
    sub = Subscription()
    waiter = asyncio.ensure_future(sub.get_batch())
    await asyncio.sleep(0)
    assert not waiter.done()
    sub.offer("a")
    sub.offer("b")
    assert await asyncio.wait_for(waiter, 1) == [("a", 0), ("b", 0)]
    sub.offer("c")
    sub.close()
    assert not sub.offer("d")
    assert await sub.get_batch() == [("c", 0)]
    assert await sub.get_batch() is None
    assert await sub.get() is None


@pytest.mark.parametrize("dropped", [0, 1, 127, 128, 300, 2 ** 40])
def test_dropped_is_appended_to_the_shared_encoding(dropped: int) -> None:
    event = ev(1, "TASK_FAILED") | {"metadata": {"error": "boom", "n": 3}}
    shared = encode_event(event)
    msg = pb.SubscribeResponse.FromString(with_dropped(shared, dropped))
    assert (msg.event_id, msg.type, msg.queue, msg.dropped) == (
        "e1", pb.EVENT_TYPE_TASK_FAILED, "q1", dropped)
    assert dict(msg.metadata) == {"error": "boom", "n": "3"}
    assert encode_event(ev(1, "NOT_A_TYPE")) is None


def test_whole_group_losses_are_charged_to_members_only() -> None:
    """While the budget is spent, a drop is counted once per filter group; a member
    is charged only the losses between its joining and its leaving."""
    clock = Clock()
    fan = FanOut(lambda e: e["event_id"], deliveries_per_s=1, clock=clock)
    early = Subscription()
    fan.add(early)
    fan.deliver(ev(0))  # the one token
    fan.deliver(ev(1))  # lost by the group
    late = Subscription()
    fan.add(late)
    fan.deliver(ev(2))  # lost by both
    assert (early.dropped_total, late.dropped_total) == (2, 1)
    fan.remove(early)
    fan.deliver(ev(3))  # lost by late only
    assert (early.dropped_total, late.dropped_total) == (2, 2)
    clock.now += 1
    fan.deliver(ev(4))
    assert buffered(late) == [("e4", 2)] and buffered(early) == [("e0", 0)]
    assert late.dropped_total == 2
