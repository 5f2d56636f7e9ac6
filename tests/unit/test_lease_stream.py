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
