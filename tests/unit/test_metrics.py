"""Metrics: collector names and labels, gauge refresh from (fake) Redis, RPC timing."""

from __future__ import annotations

from types import SimpleNamespace

import fakeredis
import grpc
import pytest
from prometheus_client import REGISTRY, generate_latest

from dtq_gateway import metrics, observe
from dtq_gateway.duties.queue_gauges import QueueGaugeCollector
from dtq_gateway.rpc.metrics_interceptor import MetricsInterceptor
from dtq_gateway.store import keys


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_every_collector_has_dtq_prefix_and_bounded_labels() -> None:
    allowed = {"queue", "band", "method", "code", "limit", "reason", "policy",
               "task"}  # fixed sets (task: the gateway's background tasks)
    found = 0
    for value in vars(metrics).values():
        if hasattr(value, "_labelnames") and hasattr(value, "_name"):
            found += 1
            assert value._name.startswith("dtq_")
            assert set(value._labelnames) <= allowed
    assert found >= 15


@pytest.fixture
async def fake() -> fakeredis.FakeAsyncRedis:
    r = fakeredis.FakeAsyncRedis()
    yield r
    await r.aclose()


async def test_collector_sets_depth_pending_age_and_live_workers(fake) -> None:
    s9, s2 = keys.stream("mq", 9), keys.stream("mq", 2)
    await fake.xgroup_create(s9, keys.GROUP, id="0", mkstream=True)
    await fake.xgroup_create(s2, keys.GROUP, id="0", mkstream=True)
    sec, _ = await fake.time()
    await fake.xadd(s9, {"task_id": "a"}, id=f"{(sec - 30) * 1000}-0")
    await fake.xadd(s9, {"task_id": "b"})
    await fake.xadd(s2, {"task_id": "c"})
    await fake.xreadgroup(keys.GROUP, "w1", {s9: ">"}, count=1)
    now_ms = sec * 1000
    await fake.hset(keys.worker("w1"), mapping={"last_heartbeat": now_ms})
    await fake.hset(keys.worker("w2"), mapping={"last_heartbeat": now_ms - 120_000})
    await fake.sadd(keys.WORKERS, "w1", "w2")
    await fake.sadd(keys.BUSY_QUEUES, "mq")
    collector = QueueGaugeCollector(fake, heartbeat_interval_ms=10_000)
    await collector.tick()
    assert sample("dtq_queue_depth", queue="mq", band="9") == 2
    assert sample("dtq_queue_pending", queue="mq", band="9") == 1
    assert sample("dtq_queue_depth", queue="mq", band="2") == 1
    age = sample("dtq_queue_backlog_age_seconds", queue="mq")
    assert age is not None and 0 <= age < 25  # "a" was leased; "b"/"c" are fresh
    assert sample("dtq_workers_live") == 1
    await fake.delete(s9, s2)
    await fake.srem(keys.BUSY_QUEUES, "mq")  # the reaper's step once the queue drained
    await collector.tick()
    assert sample("dtq_queue_depth", queue="mq", band="9") is None  # series removed


def queue_series(prefix: str = "cap") -> set[str]:
    return {s.labels["queue"] for m in REGISTRY.collect() if m.name.startswith("dtq_queue_")
            for s in m.samples if s.labels.get("queue", "").startswith(prefix)}


async def test_collector_reads_busy_queues_only_and_keeps_the_deepest(fake) -> None:
    for i, depth in enumerate([3, 0, 5, 1, 4]):
        for n in range(depth):
            await fake.xadd(keys.stream(f"cap{i}", n % 10), {"task_id": str(n)})
    await fake.sadd(keys.BUSY_QUEUES, "cap0", "cap1", "cap2", "cap3", "cap4")
    for i in range(50):  # drained queues: streams (and groups) left, not busy
        await fake.xgroup_create(keys.stream(f"idle{i}", 5), keys.GROUP, id="0", mkstream=True)
    collector = QueueGaugeCollector(fake, heartbeat_interval_ms=10_000, max_queues=2)
    await collector.tick()
    assert queue_series() == {"cap2", "cap4"}  # depths 5 and 4
    assert sample("dtq_metrics_queues_omitted") == 3
    assert sample("dtq_queue_depth", queue="cap2", band="0") == 1
    await fake.srem(keys.BUSY_QUEUES, "cap2", "cap4")
    await collector.tick()
    assert queue_series() == {"cap0", "cap3"}
    assert sample("dtq_metrics_queues_omitted") == 1
    await fake.delete(keys.BUSY_QUEUES)
    await collector.tick()
    assert queue_series() == set() and sample("dtq_metrics_queues_omitted") == 0


def test_every_queue_labelled_collector_is_forgotten_with_its_queue() -> None:
    labelled = {value._name for value in vars(metrics).values()
                if hasattr(value, "_labelnames") and "queue" in value._labelnames}
    forgotten = {c._name for c in metrics.QUEUE_COLLECTORS + metrics.QUEUE_BAND_COLLECTORS}
    assert labelled == forgotten
    assert all(c._labelnames == ("queue",) for c in metrics.QUEUE_COLLECTORS)
    assert all(c._labelnames == ("queue", "band") for c in metrics.QUEUE_BAND_COLLECTORS)


async def test_collector_forgets_queues_gone_from_the_registry(fake) -> None:
    """A queue deleted elsewhere (another replica's idle sweep, an operator) loses every
    series at this replica's next refresh; a registered or busy one keeps them."""
    for q in ("reg-gone", "reg-kept", "reg-busy"):
        observe.enqueued(q)
        observe.outcome(q, "ok", 1_000, 2_000)
    metrics.QUEUE_DEPTH.labels(queue="reg-gone", band="3").set(1)  # left by a past tick
    metrics.RATE_LIMITED_READS.labels("reg-gone").inc()
    await fake.zadd(keys.QUEUES, {"reg-kept": 0})
    await fake.sadd(keys.BUSY_QUEUES, "reg-busy")  # e.g. re-created by a stale gateway
    await QueueGaugeCollector(fake, heartbeat_interval_ms=10_000).tick()
    text = generate_latest(REGISTRY).decode()
    assert 'queue="reg-gone"' not in text
    for q in ("reg-kept", "reg-busy"):
        assert sample("dtq_tasks_enqueued_total", queue=q) == 1
        assert sample("dtq_task_run_seconds_count", queue=q) == 1
    observe.enqueued("reg-gone")  # the name used again: a new series, from 0
    assert sample("dtq_tasks_enqueued_total", queue="reg-gone") == 1


class Ctx:
    def __init__(self, code: object = None) -> None:
        self._code = code

    def code(self) -> object:
        return self._code


async def test_interceptor_observes_method_and_code() -> None:
    async def ok(request: object, context: object) -> str:
        return "fine"

    async def bad(request: object, context: Ctx) -> str:
        context._code = grpc.StatusCode.NOT_FOUND
        raise RuntimeError("aborted")

    async def stream(request: object, context: object):
        yield 1
        yield 2

    cases = [("/dtq.v1.Admin/ListQueues", grpc.unary_unary_rpc_method_handler(ok), "OK"),
             ("/dtq.v1.Admin/GetQueueStats", grpc.unary_unary_rpc_method_handler(bad),
              "NOT_FOUND"),
             ("/dtq.v1.Events/Subscribe", grpc.unary_stream_rpc_method_handler(stream), "OK")]
    for method, handler, code in cases:
        before = sample("dtq_rpc_duration_seconds_count", method=method, code=code) or 0

        async def continuation(details: object, h=handler) -> grpc.RpcMethodHandler:
            return h

        wrapped = await MetricsInterceptor().intercept_service(
            continuation, SimpleNamespace(method=method, invocation_metadata=()))
        if wrapped.unary_stream:
            assert [x async for x in wrapped.unary_stream(None, Ctx())] == [1, 2]
        else:
            try:
                await wrapped.unary_unary(None, Ctx())
            except RuntimeError:
                pass
        assert sample("dtq_rpc_duration_seconds_count", method=method, code=code) == before + 1


async def test_interceptor_passes_unknown_methods_through() -> None:
    async def continuation(details: object) -> None:
        return None

    assert await MetricsInterceptor().intercept_service(
        continuation, SimpleNamespace(method="/x.Y/Z", invocation_metadata=())) is None
