"""A gateway over 2,000 drained queues: leases come back in time, listings stay paged.

The leftovers (ten empty band streams with their group per queue, and the registry
entry) are written directly, the way a gateway leaves a drained queue.
"""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from dtq_gateway.store import keys
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.support.drained_queues import leftovers
from tests.support.leasing import LeaseStream

IDLE_QUEUES = 2000


async def test_lost_lease_among_drained_queues_is_leased_again_within_vt_plus_2s(
        gateway, broker_stub, channel, redis_url) -> None:
    r = aioredis.Redis.from_url(redis_url)
    try:
        names = await leftovers(r, IDLE_QUEUES, prefix="drained", backfilled=False)
        vt_s = gateway.settings.visibility_timeout_s
        done = await broker_stub.Enqueue(pb.EnqueueRequest(
            queue="live", task_type="t", payload=b"{}", max_attempts=3))
        assert await r.sismember(keys.BUSY_QUEUES, "live")  # enqueue.lua added it
        silent = await LeaseStream(broker_stub, "w-silent", ["live"],
                                   heartbeat=False).open()
        first = await silent.next()
        leased_at = time.monotonic()
        waiting = await LeaseStream(broker_stub, "w-live", ["live"]).open()
        again = await waiting.next(timeout_s=vt_s + 3)
        took_s = time.monotonic() - leased_at
        assert (again.task_id, again.attempt) == (done.task_id, 2) and first.attempt == 1
        # the reaper looked at the one busy queue, not the 2,000 drained ones (the
        # bound on time is loose: a loaded 2-core machine adds its own delays)
        assert gateway.scheduler.reaper.queue_calls < 100
        assert took_s < vt_s + 2.0, took_s
        silent.close()
        waiting.close()

        admin = dtq_pb2_grpc.AdminStub(channel)
        started = time.monotonic()
        page = await admin.ListQueues(pb.ListQueuesRequest())
        assert time.monotonic() - started < 1.0  # generous: the bench measures ~10 ms
        assert [q.name for q in page.queues] == names[:100]
        assert page.next_page_token == names[99]
        last = await admin.ListQueues(pb.ListQueuesRequest(page_size=1000,
                                                           page_token=names[-2]))
        assert [q.name for q in last.queues] == [names[-1], "live"]
        assert last.queues[1].depth == 1  # the retry entry (leased, or released at close)
        assert last.next_page_token == ""
    finally:
        await r.aclose()
