"""Debounce at enqueue (EnqueueRequest.debounce) through two real gateways on one
private Redis: races of 20 producers, the max delay of keep_last, a started task
never changed, and bad input refused."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
import redis.asyncio as aioredis

from dtq_gateway.server import Gateway
from dtq_proto import dtq_pb2
from dtq_pyworker import AsyncClient, Worker
from tests.conftest import gateway_settings
from tests.support.leasing import error_field, error_reason
from tests.worker.helpers import poll_until, running

PRODUCERS = 20


@pytest.fixture
async def two_gateways(redis_url):
    """Two gateways on the test's Redis (each runs its scheduler duty; one leads)."""
    gws = [Gateway(gateway_settings(redis_url), redis_url) for _ in range(2)]
    for gw in gws:
        await gw.start()
    yield gws
    for gw in gws:
        await gw.stop()


def _target(gw) -> str:
    return f"127.0.0.1:{gw.port}"


def _recorder(gw, runs: list, queue: str) -> Worker:
    worker = Worker([queue], _target(gw), worker_id=f"w-{queue}", drain_grace_s=5)

    @worker.task("sync")
    def sync(payload, ctx):
        runs.append((ctx.task_id, payload))

    return worker


async def _burst(clients, queue: str, debounce: dict, rounds: int = 3) -> list:
    """PRODUCERS producers (alternating between the gateways) enqueue ``rounds`` times
    each, all at once; returns the EnqueueResults."""
    async def producer(i: int) -> list:
        client = clients[i % len(clients)]
        return [await client.enqueue(queue, "sync", {"producer": i, "round": r},
                                     debounce=debounce) for r in range(rounds)]
    per = await asyncio.gather(*(producer(i) for i in range(PRODUCERS)))
    return [r for results in per for r in results]


async def test_keep_last_burst_on_two_gateways_runs_once_with_the_last_payload(two_gateways):
    runs: list = []
    debounce = {"key": "user-7", "window_ms": 1500, "mode": "keep_last",
                "max_delay_ms": 60_000}
    async with AsyncClient(_target(two_gateways[0])) as a, \
            AsyncClient(_target(two_gateways[1])) as b:
        results = await _burst([a, b], "deb", debounce)
        last = await b.enqueue("deb", "sync", {"last": True}, debounce=debounce)
        assert {r.task_id for r in results} == {last.task_id}  # one task for the burst
        assert sum(not r.debounced for r in results) == 1 and last.debounced
        assert all(r.status.name == "SCHEDULED" for r in [*results, last])
        async with running(_recorder(two_gateways[0], runs, "deb")):
            await poll_until(lambda: runs, timeout_s=30)
            # the window is over: the next enqueue with the key is a new burst
            after = await a.enqueue("deb", "sync", {"next": 1}, debounce=debounce)
            await poll_until(lambda: len(runs) == 2, timeout_s=30)
    assert runs == [(last.task_id, {"last": True}), (after.task_id, {"next": 1})]
    assert not after.debounced and after.task_id != last.task_id


async def test_keep_first_burst_on_two_gateways_runs_once_with_the_first_payload(
        two_gateways):
    runs: list = []
    debounce = {"key": "report", "window_ms": 60_000, "mode": "keep_first"}
    async with AsyncClient(_target(two_gateways[0])) as a, \
            AsyncClient(_target(two_gateways[1])) as b, \
            running(_recorder(two_gateways[1], runs, "first")):
        results = await _burst([a, b], "first", debounce)
        await poll_until(lambda: runs, timeout_s=30)
        # still within the window: absorbed although the task already ran
        late = await a.enqueue("first", "sync", {"late": True}, debounce=debounce)
        task = await a.get_task(results[0].task_id)
    created = [r for r in results if not r.debounced]
    assert len(created) == 1 and {r.task_id for r in results} == {created[0].task_id}
    assert late.debounced and late.task_id == created[0].task_id
    (run,) = runs  # exactly one run, with the payload of the enqueue that created it
    assert run[0] == created[0].task_id
    assert task.payload == run[1] and set(run[1]) == {"producer", "round"}


async def test_keep_first_window_over_starts_a_new_task(gateway):
    debounce = {"key": "k", "window_ms": 300, "mode": "keep_first"}
    async with AsyncClient(_target(gateway)) as client:
        first = await client.enqueue("win", "sync", {"n": 1}, debounce=debounce)
        deadline = asyncio.get_running_loop().time() + 30
        while True:  # absorbed until the window (Redis clock) is over
            again = await client.enqueue("win", "sync", {"n": 2}, debounce=debounce)
            if not again.debounced:
                break
            assert again.task_id == first.task_id
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
    assert again.task_id != first.task_id and not first.debounced


async def test_debounce_keys_are_scoped_to_their_queue(gateway):
    debounce = {"key": "same", "window_ms": 60_000, "mode": "keep_first"}
    async with AsyncClient(_target(gateway)) as client:
        a = await client.enqueue("scope-a", "sync", {}, debounce=debounce)
        b = await client.enqueue("scope-b", "sync", {}, debounce=debounce)
    assert not a.debounced and not b.debounced and a.task_id != b.task_id


async def test_keep_last_never_delays_beyond_max_delay(gateway, redis_url):
    debounce = {"key": "busy", "window_ms": 1000, "mode": "keep_last", "max_delay_ms": 2500}
    r = aioredis.Redis.from_url(redis_url)
    ids, dues = set(), []
    async with AsyncClient(_target(gateway)) as client:
        first = await client.enqueue("cap", "sync", {"n": 0}, debounce=debounce)
        created = int(await r.hget(f"dtq:task:{{{first.task_id.split('-')[1]}}}:"
                                   f"{first.task_id}", "created_at_ms"))
        n = 0
        deadline = asyncio.get_running_loop().time() + 30
        while True:  # keep enqueuing faster than the window until the task moves on
            n += 1
            out = await client.enqueue("cap", "sync", {"n": n}, debounce=debounce)
            ids.add(out.task_id)
            if out.task_id != first.task_id:
                break
            task = await client.get_task(first.task_id)
            if task.status.name == "SCHEDULED":
                dues.append(task.due_at_ms)
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.1)
        moved = await client.get_task(first.task_id)
    await r.aclose()
    assert dues and max(dues) == created + 2500  # pushed back until capped, never beyond
    assert moved.status.name != "SCHEDULED" and not out.debounced and len(ids) == 2
    assert moved.payload["n"] < n  # the new burst did not touch it


async def test_keep_last_started_task_is_never_changed(gateway):
    debounce = {"key": "doc-1", "window_ms": 200, "mode": "keep_last"}
    started, release = asyncio.Event(), asyncio.Event()
    worker = Worker(["started"], _target(gateway), worker_id="w-started", drain_grace_s=5)

    @worker.task("sync")
    async def sync(payload, ctx):
        started.set()
        await release.wait()

    async with AsyncClient(_target(gateway)) as client, running(worker):
        first = await client.enqueue("started", "sync", {"v": 1}, debounce=debounce)
        await asyncio.wait_for(started.wait(), 30)
        second = await client.enqueue("started", "sync", {"v": 2}, debounce=debounce)
        running_task = await client.get_task(first.task_id)
        release.set()
    assert not second.debounced and second.task_id != first.task_id
    assert running_task.status.name == "ACTIVE" and running_task.payload == {"v": 1}


async def test_enqueue_batch_debounces_per_item(gateway):
    last = {"key": "b", "window_ms": 60_000, "mode": "keep_last"}
    async with AsyncClient(_target(gateway)) as client:
        out = await client.enqueue_batch([
            {"queue": "batch", "task_type": "sync", "payload": {"i": i}, "debounce": last,
             "metadata": {"i": str(i)}, "content_type": f"application/x-{i}+json"}
            for i in range(3)] + [{"queue": "batch", "task_type": "sync", "payload": {}}])
        task = await client.get_task(out[0].task_id)
    assert [r.debounced for r in out] == [False, True, True, False]
    assert len({r.task_id for r in out[:3]}) == 1 and out[3].task_id != out[0].task_id
    assert task.payload == {"i": 2} and task.metadata == {"i": "2"}
    assert task.content_type == "application/x-2+json"


BAD = [
    ({"key": "", "window_ms": 10, "mode": 1}, {}, "debounce.key"),
    ({"key": "x" * 257, "window_ms": 10, "mode": 1}, {}, "debounce.key"),
    ({"key": "k", "window_ms": 0, "mode": 1}, {}, "debounce.window_ms"),
    ({"key": "k", "window_ms": 365 * 86_400_000 + 1, "mode": 1}, {}, "debounce.window_ms"),
    ({"key": "k", "window_ms": 10}, {}, "debounce.mode"),
    ({"key": "k", "window_ms": 10, "mode": 1, "max_delay_ms": 20}, {},
     "debounce.max_delay_ms"),
    ({"key": "k", "window_ms": 10, "mode": 2, "max_delay_ms": 9}, {},
     "debounce.max_delay_ms"),
    ({"key": "k", "window_ms": 10, "mode": 2}, {"delay_ms": 5}, "debounce"),
    ({"key": "k", "window_ms": 10, "mode": 2},
     {"not_before_ms": int(time.time() * 1000) + 60_000}, "debounce"),
    ({"key": "k", "window_ms": 10, "mode": 1}, {"idempotency_key": "i"}, "debounce"),
    ({"key": "k", "window_ms": 10, "mode": 1},
     {"chain": [dtq_pb2.EnqueueRequest(queue="bad", task_type="next")]}, "debounce"),
]


@pytest.mark.parametrize(("debounce", "extra", "field"), BAD)
async def test_bad_debounce_is_refused_naming_the_field(broker_stub, redis_url, debounce,
                                                        extra, field):
    req = dtq_pb2.EnqueueRequest(queue="bad", task_type="sync",
                                 debounce=dtq_pb2.Debounce(**debounce), **extra)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await broker_stub.Enqueue(req)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (error_reason(err.value), error_field(err.value)) == ("INVALID_FIELD", field)
    batch = await broker_stub.EnqueueBatch(dtq_pb2.EnqueueBatchRequest(items=[req]))
    assert batch.results[0].error.field == f"items[0].{field}"
    r = aioredis.Redis.from_url(redis_url)
    assert not [k async for k in r.scan_iter("dtq:task:*")]  # nothing was written
    await r.aclose()


async def test_a_group_item_cannot_be_debounced(broker_stub):
    item = dtq_pb2.EnqueueRequest(queue="grp", task_type="sync", debounce=dtq_pb2.Debounce(
        key="k", window_ms=10, mode=dtq_pb2.DEBOUNCE_MODE_KEEP_FIRST))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await broker_stub.EnqueueBatch(dtq_pb2.EnqueueBatchRequest(
            items=[item], group_callback=dtq_pb2.EnqueueRequest(queue="grp", task_type="done")))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_field(err.value) == "items[0].debounce"
