"""Worker ids and leases are bound to the identity that registered them; lease ids are
signed with the deployment's secret (real gateways, real Redis)."""

from __future__ import annotations

import asyncio
import itertools
import re
from pathlib import Path

import grpc
import pytest

from dtq_gateway.server import Gateway
from dtq_gateway.store import keys
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.conftest import gateway_settings
from tests.support.leasing import LeaseStream, error_field, error_reason

TOKENS = ("tok-worker-a=worker:alice,tok-worker-b=worker:bob,"
          "tok-producer=producer:app,tok-admin=admin:ops")


class Authed:
    """Stubs whose every call carries one bearer token."""

    def __init__(self, channel, token: str) -> None:
        self.md = (("authorization", f"Bearer {token}"),)
        self.stub = dtq_pb2_grpc.BrokerStub(channel)

    def __getattr__(self, name):
        method = getattr(self.stub, name)

        def call(request, **kw):
            kw.setdefault("metadata", self.md)
            return method(request, **kw)

        return call


async def _denied(coro) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await coro
    assert exc.value.code() == grpc.StatusCode.PERMISSION_DENIED, exc.value
    return exc.value


@pytest.fixture
async def authed(redis_url):
    gw = Gateway(gateway_settings(redis_url, auth_tokens=TOKENS), redis_url)
    await gw.start()
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}")
    yield gw, Authed(ch, "tok-worker-a"), Authed(ch, "tok-worker-b"), Authed(ch, "tok-producer")
    await ch.close()
    await gw.stop()


async def test_another_token_cannot_act_as_a_registered_worker(authed):
    gw, alice, bob, producer = authed
    await producer.Enqueue(pb.EnqueueRequest(queue="q", task_type="t", payload=b"{}"))
    stream = await LeaseStream(alice, "wA", ["q"]).open()
    task = await stream.next()
    # bob presents alice's lease id: every completion is refused, nothing changes
    for call in (bob.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=task.lease_id)])),
                 bob.Fail(pb.FailRequest(items=[pb.FailItem(
                     lease_id=task.lease_id, mode=pb.FAIL_MODE_RELEASE)]))):
        err = await _denied(call)
        assert error_reason(err) == "LEASE_NOT_OWNED"
    # heartbeat (and drain) as wA, and a Lease stream taking wA over
    err = await _denied(bob.Heartbeat(pb.HeartbeatRequest(worker_id="wA",
                                                          lease_ids=[task.lease_id])))
    assert (error_reason(err), error_field(err)) == ("WORKER_ID_NOT_OWNED", "worker_id")
    await _denied(bob.Heartbeat(pb.HeartbeatRequest(worker_id="wA", draining=True)))
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await LeaseStream(bob, "wA", ["q"], heartbeat=False).open()
    assert (exc.value.code(), error_reason(exc.value)) == (
        grpc.StatusCode.PERMISSION_DENIED, "WORKER_ID_NOT_OWNED")
    # alice's stream was not drained: it still receives, and her ack completes
    assert (await gw.redis.hget(keys.worker("wA"), "status")) != b"draining"
    await producer.Enqueue(pb.EnqueueRequest(queue="q", task_type="t", payload=b"{}"))
    second = await stream.next()
    ok = await alice.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=task.lease_id),
                                              pb.AckItem(lease_id=second.lease_id)]))
    assert [r.status for r in ok.results] == [pb.TASK_STATUS_SUCCEEDED] * 2
    # bob's own worker id works for bob
    beat = await bob.Heartbeat(pb.HeartbeatRequest(worker_id="wB"))
    assert beat.heartbeat_interval_ms > 0
    stream.close()


async def test_a_forged_lease_id_is_refused(authed):
    _, alice, _, producer = authed
    r = await producer.Enqueue(pb.EnqueueRequest(queue="q", task_type="t", payload=b"{}"))
    stream = await LeaseStream(alice, "wA", ["q"]).open()
    task = await stream.next()
    parts = task.lease_id.split("|")
    parts[9] = "A" * 22  # a made-up MAC
    err = await _denied(alice.Ack(pb.AckRequest(items=[pb.AckItem(lease_id="|".join(parts))])))
    assert error_reason(err) == "LEASE_SIGNATURE"
    got = await producer.GetTask(pb.GetTaskRequest(task_id=r.task_id))
    assert got.task.status == pb.TASK_STATUS_ACTIVE
    stream.close()


async def _lease_one(gw: Gateway, queue: str) -> pb.LeasedTask:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
        stub = dtq_pb2_grpc.BrokerStub(ch)
        await stub.Enqueue(pb.EnqueueRequest(queue=queue, task_type="t", payload=b"{}"))
        stream = await LeaseStream(stub, "w1", [queue]).open()
        task = await stream.next()
        stream.close()
        return task


async def _ack_at(gw: Gateway, lease_id: str) -> grpc.aio.AioRpcError | pb.AckResponse:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
        try:
            return await dtq_pb2_grpc.BrokerStub(ch).Ack(
                pb.AckRequest(items=[pb.AckItem(lease_id=lease_id)]))
        except grpc.aio.AioRpcError as exc:
            return exc


async def test_replicas_share_the_secret_stored_in_redis(redis_url):
    one = Gateway(gateway_settings(redis_url), redis_url)
    two = Gateway(gateway_settings(redis_url), redis_url)
    await asyncio.gather(one.start(), two.start())
    try:
        task = await _lease_one(one, "q")
        reply = await _ack_at(two, task.lease_id)
        assert reply.results[0].status == pb.TASK_STATUS_SUCCEEDED
    finally:
        await asyncio.gather(one.stop(), two.stop())


async def test_configured_secrets_rotate_without_downtime(redis_url):
    old, new = "old-secret-0123456789", "new-secret-0123456789"
    before = Gateway(gateway_settings(redis_url, lease_secret=old), redis_url)
    after = Gateway(gateway_settings(redis_url, lease_secret=f"{new},{old}"), redis_url)
    only_new = Gateway(gateway_settings(redis_url, lease_secret=new), redis_url)
    for gw in (before, after, only_new):
        await gw.start()
    try:
        issued_before = await _lease_one(before, "qa")
        assert (await _ack_at(after, issued_before.lease_id)).results[0].status == \
            pb.TASK_STATUS_SUCCEEDED
        issued_after = await _lease_one(after, "qb")
        assert (await _ack_at(only_new, issued_after.lease_id)).results[0].status == \
            pb.TASK_STATUS_SUCCEEDED
        stale = await _lease_one(before, "qc")  # the old secret, once it is dropped
        err = await _ack_at(only_new, stale.lease_id)
        assert isinstance(err, grpc.aio.AioRpcError)
        assert (err.code(), error_reason(err)) == (grpc.StatusCode.PERMISSION_DENIED,
                                                   "LEASE_SIGNATURE")
    finally:
        for gw in (before, after, only_new):
            await gw.stop()


def rotation_steps() -> list[str]:
    """The DTQ_LEASE_SECRET of each numbered step of security.md's rotation, in order,
    with the placeholders ``<old>`` and ``<new>`` left in."""
    text = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    section = text.split("**Rotation without downtime.**", 1)[1].split("\n\n", 2)[1]
    steps = re.findall(r"^\d+\. .*?`DTQ_LEASE_SECRET=([^`]*)`", section,
                       re.MULTILINE | re.DOTALL)
    assert len(steps) >= 2 and steps[-1] == "<new>", section
    return steps


@pytest.mark.parametrize("start", ["configured", "stored"])
async def test_rotation_procedure_never_refuses_a_valid_lease(redis_url, start):
    """security.md's steps, starting from a configured secret or from the one stored in
    Redis (DTQ_LEASE_SECRET empty): during every rolling restart a replica at one step
    and a replica at the next ack each other's leases; none is LEASE_SIGNATURE."""
    old, new = "old-secret-0123456789", "new-secret-0123456789"
    if start == "stored":
        gw = Gateway(gateway_settings(redis_url), redis_url)  # creates the stored secret
        await gw.start()
        old = (await gw.redis.get(keys.LEASE_SECRET)).decode()
        await gw.stop()
    configs = ["" if start == "stored" else old] + [
        step.replace("<old>", old).replace("<new>", new) for step in rotation_steps()]
    gateways = [Gateway(gateway_settings(redis_url, lease_secret=c), redis_url) for c in configs]
    for gw in gateways:
        await gw.start()
    try:
        for i, (before, after) in enumerate(itertools.pairwise(gateways)):
            for n, (issuer, acker) in enumerate(((before, after), (after, before))):
                task = await _lease_one(issuer, f"q{i}-{n}")
                reply = await _ack_at(acker, task.lease_id)
                assert not isinstance(reply, grpc.aio.AioRpcError), (
                    f"step {i} -> {i + 1}: {configs[i]!r} / {configs[i + 1]!r}: {reply}")
                assert reply.results[0].status == pb.TASK_STATUS_SUCCEEDED
        # the shortcut security.md warns against: a replica still on the old secret alone
        # refuses what a replica already signing with the new one issued
        signing_new = Gateway(gateway_settings(redis_url, lease_secret=f"{new},{old}"),
                              redis_url)
        await signing_new.start()
        gateways.append(signing_new)
        err = await _ack_at(gateways[0], (await _lease_one(signing_new, "q-skip")).lease_id)
        assert isinstance(err, grpc.aio.AioRpcError)
        assert (err.code(), error_reason(err)) == (grpc.StatusCode.PERMISSION_DENIED,
                                                   "LEASE_SIGNATURE")
    finally:
        for gw in gateways:
            await gw.stop()
