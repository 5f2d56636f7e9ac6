"""The Lease stream writer (dtq_gateway.rpc.lease_stream) with a recording call and
dispatcher: batch sizes, the end marker after a batch, per-task accounting."""

from __future__ import annotations

import asyncio

import pytest

from dtq_gateway.errors import InvalidArgument
from dtq_gateway.leasing.sessions import Session
from dtq_gateway.rpc.lease_stream import (
    MAX_LEASE_BATCH,
    check_max_batch,
    take_ready,
    write_tasks,
)
from dtq_proto import dtq_pb2 as pb


class Call:
    """A Lease call that records what is written (``fail_at``: the write that fails as
    if the worker had gone away)."""

    def __init__(self, fail_at: int = -1) -> None:
        self.written: list[pb.LeaseResponse] = []
        self.fail_at = fail_at
        self.gone = False

    async def write(self, message: pb.LeaseResponse) -> None:
        if len(self.written) == self.fail_at:
            self.gone = True
            raise RuntimeError("stream closed")
        self.written.append(message)

    def cancelled(self) -> bool:
        return self.gone

    def done(self) -> bool:
        return self.gone


class Dispatcher:
    def __init__(self) -> None:
        self.buffered_deltas: list[int] = []
        self.progress = 0

    def buffered(self, session, delta: int) -> None:
        self.buffered_deltas.append(delta)

    def stream_progress(self, session) -> None:
        self.progress += 1


def task(i: int) -> pb.LeasedTask:
    return pb.LeasedTask(lease_id=f"L{i}", task_id=f"T{i}", payload=b"x" * i)


def session_with(*items) -> Session:
    s = Session(worker_id="w", queues=["q"], max_in_flight=100, read_by_slot=False)
    for item in items:
        s.out.put_nowait(item)
    return s


@pytest.mark.parametrize("asked, granted", [(0, 0), (1, 0), (2, 2), (256, 256)])
def test_max_batch_granted(asked, granted):
    assert check_max_batch(asked) == granted


def test_max_batch_over_the_bound_names_the_field():
    with pytest.raises(InvalidArgument) as err:
        check_max_batch(MAX_LEASE_BATCH + 1)
    assert err.value.field == "max_batch"


def test_take_ready_stops_at_max_batch_and_at_the_end_marker():
    out: asyncio.Queue = asyncio.Queue()
    for i in range(2, 6):
        out.put_nowait(task(i))
    tasks, ended = take_ready(out, task(1), 3, 1000)
    assert [t.lease_id for t in tasks] == ["L1", "L2", "L3"] and not ended
    out.put_nowait(None)
    tasks, ended = take_ready(out, task(9), 8, 1000)
    assert [t.lease_id for t in tasks] == ["L9", "L4", "L5"] and ended
    assert out.empty()
    tasks, ended = take_ready(out, task(7), 0, 1000)
    assert [t.lease_id for t in tasks] == ["L7"] and not ended


def test_a_batch_holds_at_most_max_bytes_of_encoded_tasks_unless_it_is_one_task():
    out: asyncio.Queue = asyncio.Queue()
    for i in (4, 3, 2):  # tasks of 14, 13 and 12 encoded bytes (10 + payload)
        out.put_nowait(task(i))
    assert [task(i).ByteSize() for i in (5, 4, 3, 2, 7)] == [15, 14, 13, 12, 17]
    tasks, ended = take_ready(out, task(5), 8, 29)
    assert [t.lease_id for t in tasks] == ["L5", "L4"] and not ended  # 15 + 14 fits 29
    assert out.get_nowait().lease_id == "L3"  # did not fit: still first for the next
    tasks, _ = take_ready(out, task(20), 8, 29)  # larger alone than the bound: goes alone
    assert [t.lease_id for t in tasks] == ["L20"]
    out.put_nowait(None)
    tasks, ended = take_ready(out, task(7), 8, 29)  # 17 + 12 fits; the marker has no size
    assert [t.lease_id for t in tasks] == ["L7", "L2"] and ended


def test_metadata_counts_towards_the_batch_bound():
    out: asyncio.Queue = asyncio.Queue()
    heavy = pb.LeasedTask(lease_id="L2", task_id="T2", metadata={"k": "v" * 100})
    out.put_nowait(heavy)
    tasks, _ = take_ready(out, task(1), 8, 100)  # payloads alone (1 byte) would fit
    assert [t.lease_id for t in tasks] == ["L1"]


async def test_without_max_batch_every_task_is_its_own_message():
    session, call, disp = session_with(task(1), task(2), task(3), None), Call(), Dispatcher()
    assert await write_tasks(call, session, disp, 0, 1000) is True
    assert [m.WhichOneof("kind") for m in call.written] == ["task"] * 3
    assert [m.task.lease_id for m in call.written] == ["L1", "L2", "L3"]
    assert disp.buffered_deltas == [-1, -2, -3] and disp.progress == 3


async def test_batches_hold_what_is_waiting_and_the_end_marker_ends_after_the_batch():
    session = session_with(*(task(i) for i in range(1, 6)), None)
    call, disp = Call(), Dispatcher()
    assert await write_tasks(call, session, disp, 3, 1000) is True
    assert [m.WhichOneof("kind") for m in call.written] == ["batch", "batch"]
    assert [[t.lease_id for t in m.batch.tasks] for m in call.written] == \
        [["L1", "L2", "L3"], ["L4", "L5"]]
    assert sum(disp.buffered_deltas) == -15 and disp.progress == 2
    # every lease is unread, in write order, until a receipt names it
    assert list(session.unread) == ["L1", "L2", "L3", "L4", "L5"]
    assert [seq for seq, _ in session.unread.values()] == [1, 2, 3, 4, 5]


async def test_a_failed_write_ends_the_stream_as_gone():
    session = session_with(task(1), task(2), task(3))
    call = Call(fail_at=0)
    assert await write_tasks(call, session, Dispatcher(), 2, 1000) is False
    assert call.written == []


async def test_a_cancel_notice_is_written_alone_in_its_place_between_the_tasks():
    notice = pb.LeaseCancelled(lease_ids=["L1"])
    session = session_with(task(1), task(2), notice, task(3), None)
    call, disp = Call(), Dispatcher()
    assert await write_tasks(call, session, disp, 8, 1000) is True
    assert [m.WhichOneof("kind") for m in call.written] == ["batch", "cancelled", "batch"]
    assert [t.lease_id for t in call.written[0].batch.tasks] == ["L1", "L2"]
    assert list(call.written[1].cancelled.lease_ids) == ["L1"]
    assert list(session.unread) == ["L1", "L2", "L3"]  # a notice is no lease
    assert sum(disp.buffered_deltas) == -6 and disp.progress == 3


async def test_a_cancel_request_is_queued_with_the_lease_id_on_the_streams_that_accept_it():
    from dtq_gateway.leasing.dispatch import Dispatcher as LeaseDispatcher
    from dtq_gateway.leasing.leaseid import Lease, decode, owner_tag
    from dtq_gateway.rpc.events_servicer import encode_event
    from dtq_gateway.settings import load

    released: list[list[str]] = []

    async def release(ids):
        released.append(ids)

    disp = LeaseDispatcher(None, load([], environ={}), None, release)
    raw = b'{"events":[["TASK_CANCEL_REQUESTED","t"]]}'
    assert not disp.wants_raw_event(raw)  # no stream takes notices: not even decoded
    owner = owner_tag("alice")
    takes, old, other = (Session(worker_id=w, queues=["q"], max_in_flight=4, owner=owner,
                                 read_by_slot=False, cancel_notices=n)
                         for w, n in (("w", True), ("w", False), ("w2", True)))
    for s in (takes, old, other):
        disp.register(s)
    assert disp.wants_raw_event(raw)
    task_id = "ab" * 16
    event = {"type": "TASK_CANCEL_REQUESTED", "task_id": task_id, "queue": "q",
             "task_type": "t", "attempt": 2, "worker_id": "w",
             "metadata": {"entry_id": "17-0", "band": "5", "idem_digest": ""}}
    assert encode_event(event) is None  # internal: Events.Subscribe never shows it
    disp.on_event(event)
    notice = takes.out.get_nowait()
    assert isinstance(notice, pb.LeaseCancelled) and takes.out.empty()
    assert decode(notice.lease_ids[0], disp.keyring, caller="alice") == \
        Lease(task_id, "q", 5, "17-0", 2, "w", "", owner)  # the id the worker holds
    assert old.out.empty() and other.out.empty()
    assert disp.cancel_requested({**event, "metadata": {"band": "x", "entry_id": "1-0"}}) == 0
    # a stream that ends with a notice unwritten releases leases only
    takes.out.put_nowait(notice)
    takes.out.put_nowait(task(1))
    await disp.unregister(takes)
    assert released == [["L1"]]
    assert disp.wants_raw_event(raw)  # "other" still takes notices
    await disp.unregister(other)
    assert not disp.wants_raw_event(raw)  # the last stream taking notices is gone
