"""Writing a Lease stream: the tasks a session's dispatcher queued, one or a batch per
message.

A session's ``out`` queue (leasing.sessions.Session) receives every task the dispatcher
activated for it, then, last, the end marker None. The Lease handler writes them in
order. A worker that set ``LeaseRequest.max_batch`` > 1 gets, per write, the task the
handler waited for plus every task already waiting, up to max_batch tasks and at most
the largest payload of one task in encoded task bytes, as one LeasedTaskBatch: one gRPC write and one worker wake-up per read of the gateway instead
of one per task. A worker that did not set it gets one LeasedTask per message, the
original protocol (docs/protocol.md 3.2). Flow control stays per task either way: the
buffered-bytes account, the unread window (``Session.handed``) and the PEL credit all
count tasks, never messages. A worker that set ``LeaseRequest.accept_cancel_notices``
also gets LeaseCancelled messages between them (Dispatcher.cancel_requested).
"""

from __future__ import annotations

import asyncio
import time

import grpc

from dtq_gateway.errors import InvalidArgument
from dtq_gateway.leasing.dispatch import Dispatcher
from dtq_gateway.leasing.sessions import Session
from dtq_proto import dtq_pb2

#: Most tasks per Lease stream message (LeaseRequest.max_batch, 0..256).
MAX_LEASE_BATCH = 256


def check_max_batch(max_batch: int) -> int:
    """The granted max_batch of a LeaseRequest: 0 for 0 or 1 (one LeasedTask per
    message), else the request's value, 2..``MAX_LEASE_BATCH``.

    Raises:
        InvalidArgument: Over ``MAX_LEASE_BATCH``; names ``max_batch``.
    """
    if max_batch > MAX_LEASE_BATCH:
        raise InvalidArgument(f"max_batch: must be 0..{MAX_LEASE_BATCH}", field="max_batch")
    return max_batch if max_batch > 1 else 0


async def send(context: grpc.aio.ServicerContext, message: dtq_pb2.LeaseResponse) -> bool:
    """Write one message on the Lease stream; False when the worker went away.

    A write racing the client's cancellation fails inside grpc (ExecuteBatchError);
    written with ``context.write`` rather than yielded, that failure ends the call
    quietly here instead of being logged by grpc at ERROR as a servicer error.
    """
    try:
        await context.write(message)
    except asyncio.CancelledError:
        raise
    except Exception:
        if context.cancelled() or context.done():
            return False
        raise
    return True


def _head(out: asyncio.Queue) -> dtq_pb2.LeasedTask | dtq_pb2.LeaseCancelled | None:
    """The next item of ``out`` without taking it (asyncio.Queue has no public peek;
    its items are the deque ``_queue``)."""
    return out._queue[0]  # type: ignore[attr-defined]


def take_ready(out: asyncio.Queue, first: dtq_pb2.LeasedTask, max_batch: int,
               max_bytes: int) -> tuple[list[dtq_pb2.LeasedTask], bool]:
    """``first`` plus the tasks already waiting in ``out``, ``max_batch`` in all (0 or
    1: ``first`` alone), and whether the end marker (None) was taken: the stream ends
    once they are written (the marker is always the last item of ``out``).

    A task joins only while the batch's encoded tasks (payload, metadata, ids: every
    field) stay within ``max_bytes`` (the largest payload one task may carry): a batch
    then never needs a larger gRPC receive limit than a single task, whatever the
    tasks' metadata. A task that does not fit stays first in ``out`` for the next
    message; a task larger than ``max_bytes`` goes alone. A cancel notice
    (LeaseCancelled) ends the batch: it is written in its own message after it.
    """
    tasks, size = [first], first.ByteSize()
    while len(tasks) < max_batch and not out.empty():
        head = _head(out)
        if head is None:
            out.get_nowait()
            return tasks, True
        if not isinstance(head, dtq_pb2.LeasedTask):
            break
        n = head.ByteSize()
        if size + n > max_bytes:
            break
        out.get_nowait()
        tasks.append(head)
        size += n
    return tasks, False


async def write_tasks(context: grpc.aio.ServicerContext, session: Session,
                      dispatcher: Dispatcher, max_batch: int, max_bytes: int) -> bool:
    """Write the session's tasks until its end marker.

    Args:
        context: The Lease call.
        session: Its session (tasks come from ``session.out``).
        dispatcher: Told of every write (buffered bytes, write progress).
        max_batch: Granted max_batch (:func:`check_max_batch`): 0 writes one
            LeaseResponse.task per message, 2..256 one LeaseResponse.batch of up to
            that many tasks.
        max_bytes: Most encoded task bytes of one batch (DTQ_MAX_PAYLOAD_BYTES); a
            task alone may carry more.

    A cancel notice (LeaseCancelled, only in the ``out`` of a session that accepts
    them) is written as its own LeaseResponse.cancelled, in its place among the tasks.

    Returns:
        True once the end marker was reached (every task queued before it was
        written), False when the worker went away (the write failed).
    """
    while True:
        first = await session.out.get()
        if first is None:
            return True
        if not isinstance(first, dtq_pb2.LeasedTask):
            if not await send(context, dtq_pb2.LeaseResponse(cancelled=first)):
                return False
            dispatcher.stream_progress(session)
            continue
        tasks, ended = take_ready(session.out, first, max_batch, max_bytes)
        dispatcher.buffered(session, -sum(len(t.payload) for t in tasks))
        # unread until a receipt names them (or a later lease): stream health
        now = time.monotonic()
        for task in tasks:
            session.handed(task.lease_id, now)
        message = (dtq_pb2.LeaseResponse(batch=dtq_pb2.LeasedTaskBatch(tasks=tasks))
                   if max_batch else dtq_pb2.LeaseResponse(task=first))
        if not await send(context, message):
            return False
        dispatcher.stream_progress(session)  # that write completed
        if ended:
            return True
