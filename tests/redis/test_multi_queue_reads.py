"""A Lease session over several queues, read in one lease_take call (standalone Redis)
or slot by slot (the Redis Cluster path, which a standalone Redis runs as well).

Both ways must give the same leases: strict p9 -> p0 across the queues and never more
than max_in_flight. The one-call way must cost one script round trip per read.
"""

from __future__ import annotations

import pytest

from dtq_gateway.leasing import reader
from dtq_gateway.leasing.sessions import Session
from dtq_gateway.store import keys
from tests.redis.test_core_scripts import Env

#: queue names whose streams hash to four different slots (asserted below)
QUEUES = ["mq-a", "mq-b", "mq-c", "mq-d"]


@pytest.fixture
async def env(redis_url):
    e = Env(redis_url)
    yield e
    await e.redis.aclose()


@pytest.fixture
def counted_reads(monkeypatch) -> list[int]:
    """Counts the lease_take calls the dispatcher sends on their own (the slot-by-slot
    reads after the first pipeline, or a standalone read's one call, which checks the
    worker itself); check_and_take's pipeline is not counted."""
    calls: list[int] = []
    original = reader.store.lease_take

    async def counting(redis, read, call):
        calls.append(1)
        return await original(redis, read, call)
    monkeypatch.setattr(reader.store, "lease_take", counting)
    return calls


def test_queues_of_the_test_span_several_slots() -> None:
    assert len({keys.key_slot(keys.stream(q, 0)) for q in QUEUES}) == len(QUEUES)


def test_standalone_layout_is_one_slot_read_cluster_layout_one_per_slot() -> None:
    one = Session(worker_id="w", queues=QUEUES, max_in_flight=1, read_by_slot=False)
    per_slot = Session(worker_id="w", queues=QUEUES, max_in_flight=1)
    assert [g.queues for g in one.slot_reads] == [QUEUES]
    assert sorted(q for g in per_slot.slot_reads for q in g.queues) == sorted(QUEUES)
    assert len(per_slot.slot_reads) == len(QUEUES)
    assert one.streams == per_slot.streams  # the session's stream order is the same


@pytest.mark.parametrize("read_by_slot", [False, True])
async def test_strict_priority_and_max_in_flight_across_queues(env, counted_reads,
                                                               read_by_slot) -> None:
    plan = [("mq-c", 1), ("mq-a", 9), ("mq-d", 5), ("mq-b", 0), ("mq-b", 9), ("mq-d", 7),
            ("mq-a", 3)]
    ids = {await env.enqueue(queue=q, priority=p): (q, p) for q, p in plan}
    session = Session(worker_id="w1", queues=QUEUES, max_in_flight=5,
                      read_by_slot=read_by_slot)
    await env.dispatcher.lease_now(session)
    got = []
    while not session.out.empty():
        got.append(session.out.get_nowait())
    assert [t.priority for t in got] == [9, 9, 7, 5, 3]
    assert {ids[t.task_id] for t in got} == {("mq-a", 9), ("mq-b", 9), ("mq-d", 7),
                                             ("mq-d", 5), ("mq-a", 3)}
    # the one-call read is one lease_take (no worker_check beside it); slot by slot
    # reads each (band, slot) holding entries on its own: p9 twice, p7, p5, p3
    assert len(counted_reads) == (5 if read_by_slot else 1)

    # at max_in_flight nothing more is read, whichever way
    again = Session(worker_id="w1", queues=QUEUES, max_in_flight=5, read_by_slot=read_by_slot)
    await env.dispatcher.lease_now(again)
    assert again.out.empty()
