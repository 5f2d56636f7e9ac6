"""KEDA's external scaler on a real gateway, called with stubs generated from KEDA's
proto (dtq_proto.keda): activity as a queue fills and drains, metrics equal to
GetQueueStats, the push of StreamIsActive, tokens and roles, bad metadata."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from dtq_gateway.server import Gateway
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from dtq_proto.keda import externalscaler_pb2 as es
from dtq_proto.keda import externalscaler_pb2_grpc as es_grpc
from tests.conftest import gateway_settings
from tests.support.leasing import LeaseStream, error_field, error_reason

POLL_S = 0.05
TOKENS = "adm-token-1=admin:ops,scale-token-1=scaler:keda,work-token-1=worker:w1"


def ref(**metadata: str) -> es.ScaledObjectRef:
    return es.ScaledObjectRef(name="workers", namespace="dtq", scalerMetadata=metadata)


async def _poll(predicate, timeout_s: float = 20.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (value := await predicate()):
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(POLL_S)
    return value


@pytest.fixture
def scaler(channel):
    return es_grpc.ExternalScalerStub(channel)


@pytest.fixture
def admin_stub(channel):
    return dtq_pb2_grpc.AdminStub(channel)


async def _known_empty_queue(broker_stub, queue: str) -> None:
    """A queue that exists and holds no work: one task enqueued and cancelled (a queue
    only paused with create and resumed has no stream, and the idle-queue sweep may
    drop it from the registry at its next look)."""
    task = await broker_stub.Enqueue(pb.EnqueueRequest(queue=queue, task_type="t"))
    await broker_stub.CancelTask(pb.CancelTaskRequest(task_id=task.task_id))


async def test_is_active_goes_false_true_false_as_the_queue_fills_and_drains(
        gateway, broker_stub, admin_stub, scaler):
    await _known_empty_queue(broker_stub, "ka")
    assert not (await scaler.IsActive(ref(queue="ka"))).result
    for _ in range(3):
        await broker_stub.Enqueue(pb.EnqueueRequest(queue="ka", task_type="t"))
    assert (await scaler.IsActive(ref(queue="ka"))).result
    lease = await LeaseStream(broker_stub, "w-ka", ["ka"]).open()
    tasks = [await lease.next() for _ in range(3)]
    assert (await scaler.IsActive(ref(queue="ka"))).result  # leased: still work
    await broker_stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=t.lease_id)
                                                for t in tasks]))

    async def idle():
        return not (await scaler.IsActive(ref(queue="ka"))).result
    await _poll(idle)
    lease.close()


async def test_get_metrics_matches_get_queue_stats(gateway, broker_stub, admin_stub, scaler):
    for i in range(5):
        await broker_stub.Enqueue(pb.EnqueueRequest(queue="km", task_type="t", priority=i))
    lease = await LeaseStream(broker_stub, "w-km", ["km"], max_in_flight=2).open()
    await lease.next()
    await lease.next()

    async def value(metric: str) -> float:
        reply = await scaler.GetMetrics(es.GetMetricsRequest(
            scaledObjectRef=ref(queue="km", metric=metric), metricName="s0-dtq"))
        (v,) = reply.metricValues
        assert v.metricName == "s0-dtq"
        return v.metricValueFloat

    stats = await admin_stub.GetQueueStats(pb.GetQueueStatsRequest(queue="km"))
    depth = sum(b.depth for b in stats.bands)
    pending = sum(b.pending for b in stats.bands)
    assert (depth, pending) == (5, 2)
    assert await value("backlog") == depth - pending == 3
    assert await value("leased_plus_waiting") == depth == 5
    age = await value("backlog_age")
    assert abs(age - stats.oldest_task_age_ms / 1000) < 2.0
    lease.close()


async def test_metric_spec_names_the_metric_and_target(gateway, scaler):
    reply = await scaler.GetMetricSpec(ref(queues="a,b", metric="backlog_age", target="45"))
    (spec,) = reply.metricSpecs
    assert (spec.metricName, spec.targetSizeFloat, spec.targetSize) == \
        ("dtq-backlog-age-a-b", 45.0, 45)
    (default,) = (await scaler.GetMetricSpec(ref(queue="a"))).metricSpecs
    assert (default.metricName, default.targetSizeFloat) == ("dtq-backlog-a", 10.0)


async def test_several_queues_are_summed(gateway, broker_stub, scaler):
    for queue in ("s1", "s2", "s2"):
        await broker_stub.Enqueue(pb.EnqueueRequest(queue=queue, task_type="t"))
    reply = await scaler.GetMetrics(es.GetMetricsRequest(
        scaledObjectRef=ref(queues="s1, s2"), metricName="m"))
    assert reply.metricValues[0].metricValue == 3


async def test_stream_is_active_pushes_within_1_s_of_the_first_enqueue(
        gateway, broker_stub, admin_stub, scaler):
    await _known_empty_queue(broker_stub, "kp")
    stream = scaler.StreamIsActive(ref(queue="kp"))
    first = await asyncio.wait_for(stream.read(), 10)
    assert first.result is False
    started = time.monotonic()
    await broker_stub.Enqueue(pb.EnqueueRequest(queue="kp", task_type="t"))
    pushed = await asyncio.wait_for(stream.read(), 10)
    elapsed = time.monotonic() - started
    assert pushed.result is True
    assert elapsed < 1.0, f"pushed after {elapsed:.2f} s"
    stream.cancel()


@pytest.mark.parametrize("metadata, field", [
    ({"queue": "never-used"}, "scalerMetadata.queue"),
    ({}, "scalerMetadata.queue"),
    ({"queue": "bad name!"}, "scalerMetadata.queue"),
    ({"queues": ",".join(f"q{i}" for i in range(17))}, "scalerMetadata.queues"),
    ({"queue": "a", "metric": "cpu"}, "scalerMetadata.metric"),
    ({"queue": "a", "target": "0"}, "scalerMetadata.target"),
    ({"queue": "a", "target": "many"}, "scalerMetadata.target"),
    ({"queue": "a", "target": "1e308"}, "scalerMetadata.target"),  # past int64
])
async def test_bad_metadata_and_unknown_queues_are_invalid_argument(gateway, scaler,
                                                                    metadata, field):
    calls = [scaler.IsActive(ref(**metadata)),
             scaler.GetMetrics(es.GetMetricsRequest(scaledObjectRef=ref(**metadata))),
             scaler.StreamIsActive(ref(**metadata)).read()]
    for call in calls:
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await call
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_field(exc.value) == field
        if metadata.get("queue") == "never-used":
            assert error_reason(exc.value) == "UNKNOWN_QUEUE"
            assert "unknown queue 'never-used'" in exc.value.details()


@pytest.fixture
async def auth_channel(redis_url):
    gw = Gateway(gateway_settings(redis_url, auth_tokens=TOKENS), redis_url)
    await gw.start()
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}")
    yield ch
    await ch.close()
    await gw.stop()


async def test_tokens_and_roles(auth_channel):
    scaler = es_grpc.ExternalScalerStub(auth_channel)
    broker = dtq_pb2_grpc.BrokerStub(auth_channel)
    adm = (("authorization", "Bearer adm-token-1"),)
    await broker.Enqueue(pb.EnqueueRequest(queue="ks", task_type="t"), metadata=adm)
    refused = [
        (scaler.IsActive(ref(queue="ks")), "UNAUTHENTICATED"),
        (scaler.IsActive(ref(queue="ks", token="wrong-token-1")), "UNAUTHENTICATED"),
        (scaler.IsActive(ref(queue="ks"), metadata=(("authorization", "Bearer nope-nope"),)),
         "UNAUTHENTICATED"),
        (scaler.IsActive(ref(queue="ks", token="work-token-1")), "PERMISSION_DENIED"),
        (scaler.GetMetrics(es.GetMetricsRequest(
            scaledObjectRef=ref(queue="ks", token="wrong-token-1"))), "UNAUTHENTICATED"),
    ]
    for call, reason in refused:
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await call
        assert exc.value.code().name == reason
        assert error_reason(exc.value) == reason
    stream = scaler.StreamIsActive(ref(queue="ks", token="wrong-token-1"))
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stream.read()
    assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert (await scaler.IsActive(ref(queue="ks", token="scale-token-1"))).result
    # KEDA passes a resolved tokenFromEnv under its own key
    assert (await scaler.IsActive(ref(queue="ks", tokenFromEnv="scale-token-1"))).result
    assert (await scaler.IsActive(ref(queue="ks"), metadata=(
        ("authorization", "Bearer scale-token-1"),))).result
    stream = scaler.StreamIsActive(ref(queue="ks", token="scale-token-1"))
    assert (await asyncio.wait_for(stream.read(), 10)).result
    stream.cancel()
    with pytest.raises(grpc.aio.AioRpcError) as exc:  # the scaler role reads figures only
        await broker.Enqueue(pb.EnqueueRequest(queue="ks", task_type="t"),
                             metadata=(("authorization", "Bearer scale-token-1"),))
    assert exc.value.code() == grpc.StatusCode.PERMISSION_DENIED
