"""Durable acknowledgements (DTQ_REDIS_MIN_REPLICAS_ACK): an in-process gateway on a
real primary with one real replica.

With the replica following, Enqueue, EnqueueBatch, Ack and Fail answer OK and the
replica holds what they wrote when they answer. With the replica frozen (SIGSTOP) no
WAIT is confirmed: each call answers UNAVAILABLE with a message naming the setting
(the write may have been applied: the caller resends), and once the replica thaws the
resends answer OK: an Enqueue with the same idempotency key gets the same task, an
Ack its duplicate result; the tasks the unconfirmed calls stored reach the open Lease
stream at once.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
import redis

from dtq_gateway.server import Gateway
from dtq_gateway.store import keys
from dtq_gateway.store.broker import ENQUEUE
from dtq_gateway.store.completion import ACK, FAIL
from dtq_gateway.store.indexes import INDEX_ADD
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.conftest import gateway_settings
from tests.support.leasing import LeaseStream, error_reason
from tests.support.redis_sentinel import wait_for
from tests.support.redis_server import RedisServer

#: WAIT's timeout in these tests (ms): the frozen replica never answers within it, a
#: following one always does, even on a busy shared CPU.
ACK_TIMEOUT_MS = 1000


@pytest.fixture
def pair() -> Iterator[tuple[RedisServer, RedisServer]]:
    """A primary and a replica following it (link up)."""
    primary = RedisServer(appendonly=False).start()
    replica = RedisServer(appendonly=False, extra_args=(
        "--replicaof", "127.0.0.1", str(primary.port))).start()
    probe = redis.Redis(port=replica.port, socket_timeout=1)
    try:
        wait_for(lambda: probe.info("replication").get("master_link_status") == "up", 20,
                 "the replica link")
        yield primary, replica
    finally:
        probe.close()
        os.kill(replica.proc.pid, signal.SIGCONT)
        replica.cleanup()
        primary.cleanup()


@pytest.fixture
async def stubs(pair) -> AsyncIterator[tuple[dtq_pb2_grpc.BrokerStub, redis.Redis]]:
    """A Broker stub of a gateway with DTQ_REDIS_MIN_REPLICAS_ACK=1, and a client of
    the replica."""
    primary, replica = pair
    # leases outlive the frozen replica's timeouts (the test's stream sends no extensions)
    gw = Gateway(gateway_settings(primary.url, redis_min_replicas_ack=1,
                                  redis_replica_ack_timeout_ms=ACK_TIMEOUT_MS,
                                  visibility_timeout_s=60,
                                  # a stream that sends no heartbeats is not judged by
                                  # stream health here (tests/grpc/test_stream_health.py)
                                  lease_stall_heartbeats=0), primary.url)
    await gw.start()
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}")
    on_replica = redis.Redis(port=replica.port, socket_timeout=2, decode_responses=True)
    try:
        yield dtq_pb2_grpc.BrokerStub(ch), on_replica
    finally:
        on_replica.close()
        await ch.close()
        await gw.stop()


async def _resend(call, timeout_s: float = 30.0):
    """``await call()`` again while it answers UNAVAILABLE, up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await call()
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise


def _status(rds: redis.Redis, task_id: str) -> str | None:
    return rds.hget(keys.task(task_id), "status")


def _waits(port: int) -> int:
    """WAIT commands the server on ``port`` has run."""
    c = redis.Redis(port=port, socket_timeout=2)
    try:
        return int(c.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))
    finally:
        c.close()


async def test_with_the_replica_following_each_write_waits_for_it(stubs, pair) -> None:
    broker, on_replica = stubs
    primary = pair[0].port
    loader = redis.Redis(port=primary, socket_timeout=2)
    for script in (ENQUEUE, ACK, FAIL, INDEX_ADD):  # no NOSCRIPT fallback (EVAL + WAIT)
        loader.script_load(script.current()[0])  # the source sent (allow-oom shebang)
    loader.close()
    before = _waits(primary)
    one = await broker.Enqueue(pb.EnqueueRequest(queue="q", task_type="t"))
    assert _status(on_replica, one.task_id) == "queued"
    assert _waits(primary) == before + 1
    batch = await broker.EnqueueBatch(pb.EnqueueBatchRequest(items=[
        pb.EnqueueRequest(queue=q, task_type="t") for q in ("q", "q", "r")]))
    assert all(not r.HasField("error") for r in batch.results)
    assert all(_status(on_replica, r.task_id) == "queued" for r in batch.results)
    assert _waits(primary) == before + 2  # one WAIT after the batch's pipeline
    lease = await LeaseStream(broker, "w1", ["q"]).open()
    try:
        first, second = await lease.take(2)
        before = _waits(primary)
        await broker.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=first.lease_id)]))
        assert _status(on_replica, first.task_id) == "succeeded"
        await broker.Fail(pb.FailRequest(items=[pb.FailItem(
            lease_id=second.lease_id, retryable=False, error_message="no")]))
        assert _status(on_replica, second.task_id) == "dead_lettered"
        assert _waits(primary) == before + 2
    finally:
        lease.close()


async def test_a_frozen_replica_makes_writes_unavailable_and_resends_succeed(
        stubs, pair) -> None:
    broker, on_replica = stubs
    _, replica = pair
    await broker.Enqueue(pb.EnqueueRequest(queue="q", task_type="t"))
    lease = await LeaseStream(broker, "w1", ["q"]).open()
    try:
        task = await lease.next()
        os.kill(replica.proc.pid, signal.SIGSTOP)
        request = pb.EnqueueRequest(queue="q", task_type="t", idempotency_key="k1")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await broker.Enqueue(request)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert error_reason(err.value) == "REDIS_UNAVAILABLE"
        assert "DTQ_REDIS_MIN_REPLICAS_ACK" in err.value.details()
        batch = await broker.EnqueueBatch(pb.EnqueueBatchRequest(items=[
            pb.EnqueueRequest(queue="q", task_type="t"),
            pb.EnqueueRequest(queue="q", task_type="t", priority=9)]))
        assert [r.error.code for r in batch.results] == [grpc.StatusCode.UNAVAILABLE.value[0]] * 2
        assert all(r.error.reason == "REDIS_UNAVAILABLE" for r in batch.results)
        ack = pb.AckRequest(items=[pb.AckItem(lease_id=task.lease_id)])
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await broker.Ack(ack)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        os.kill(replica.proc.pid, signal.SIGCONT)
        # the resends, as a client makes them until answered OK (the thawed replica
        # first works through its backlog)
        again = await _resend(lambda: broker.Enqueue(request))
        assert again.deduplicated  # the task the first call made
        assert _status(on_replica, again.task_id) in ("queued", "active")  # on the replica
        # what the unconfirmed calls stored is delivered to the open session at once
        # (the task of the unconfirmed Enqueue and the two of the batch), not stranded
        # until a visibility timeout
        delivered = {t.task_id for t in await lease.take(3, timeout_s=15)}
        assert again.task_id in delivered
        done = await _resend(lambda: broker.Ack(ack))
        assert done.results[0].duplicate
        assert _status(on_replica, task.task_id) == "succeeded"
    finally:
        os.kill(replica.proc.pid, signal.SIGCONT)
        lease.close()
