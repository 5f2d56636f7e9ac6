"""Progress, chains and groups through the real gRPC API on a real Redis."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace

import grpc
import pytest

from dtq_gateway.domain.followup_plan import callback_task_id, step_task_id
from dtq_gateway.leasing.completion import Completion
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.support.leasing import LeaseStream, error_field, poll


def enq(queue="q", task_type="t", payload=b"{}", **kw) -> pb.EnqueueRequest:
    return pb.EnqueueRequest(queue=queue, task_type=task_type, payload=payload, **kw)


async def get(stub, task_id: str) -> pb.Task:
    return (await stub.GetTask(pb.GetTaskRequest(task_id=task_id))).task


async def ack(stub, task: pb.LeasedTask, result: bytes = b"") -> None:
    await stub.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=task.lease_id, result=result)]))


async def fail(stub, task: pb.LeasedTask, retryable: bool = False) -> None:
    await stub.Fail(pb.FailRequest(items=[pb.FailItem(
        lease_id=task.lease_id, error_message="boom", error_class="ValueError",
        retryable=retryable)]))


async def subscribe(channel, gateway, types):
    call = dtq_pb2_grpc.EventsStub(channel).Subscribe(pb.SubscribeRequest(types=types))
    await asyncio.wait_for(gateway.ops.hub.connected.wait(), 5)

    async def subscribers() -> int:
        return gateway.ops.hub.subscriber_count

    await poll(subscribers, lambda n: n > 0, timeout_s=5)
    return call


async def test_progress_is_stored_and_published(channel, broker_stub, gateway):
    events = await subscribe(channel, gateway, [pb.EVENT_TYPE_TASK_PROGRESS])
    r = await broker_stub.Enqueue(enq())
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    task = await lease.next()
    await broker_stub.Heartbeat(pb.HeartbeatRequest(
        worker_id="w1", lease_ids=[task.lease_id],
        progress=[pb.TaskProgress(lease_id=task.lease_id, percent=42.5, message="resizing")]))
    got = await get(broker_stub, r.task_id)
    assert (got.progress_percent, got.progress_message) == (42.5, "resizing")
    assert got.progress_at_ms >= got.started_at_ms > 0
    ev = await asyncio.wait_for(events.__aiter__().__anext__(), 5)
    assert (ev.type, ev.task_id, ev.worker_id) == (pb.EVENT_TYPE_TASK_PROGRESS, r.task_id, "w1")
    assert (float(ev.metadata["percent"]), ev.metadata["message"]) == (42.5, "resizing")
    # clamped, and cut to 256 bytes
    await broker_stub.Heartbeat(pb.HeartbeatRequest(
        worker_id="w1", lease_ids=[task.lease_id],
        progress=[pb.TaskProgress(lease_id=task.lease_id, percent=250, message="x" * 999)]))
    got = await get(broker_stub, r.task_id)
    assert (got.progress_percent, len(got.progress_message)) == (100.0, 256)
    await ack(broker_stub, task)
    # a report for a lease that is no longer current changes nothing
    await broker_stub.Heartbeat(pb.HeartbeatRequest(
        worker_id="w1", lease_ids=[task.lease_id],
        progress=[pb.TaskProgress(lease_id=task.lease_id, percent=1, message="late")]))
    assert (await get(broker_stub, r.task_id)).progress_message == "x" * 256
    events.cancel()
    lease.close()


async def test_chain_passes_results_and_reports_its_state(broker_stub):
    r = await broker_stub.Enqueue(enq(payload=b'{"n": 1}', chain=[
        enq(queue="q2", task_type="double", payload=b""),
        enq(task_type="report", payload=b'{"fixed": true}')]))
    second = step_task_id(r.task_id, "q2")
    assert r.chain_task_ids == [second, step_task_id(second, "q")]
    a = await get(broker_stub, r.task_id)
    assert (a.chain_id, a.chain_step, a.chain_state) == (r.task_id, 0, pb.CHAIN_STATE_WAITING)
    lease = await LeaseStream(broker_stub, "w1", ["q", "q2"]).open()
    task_a = await lease.next()
    await ack(broker_stub, task_a, b'{"n": 2}')
    task_b = await lease.next()
    assert task_b.task_id == r.chain_task_ids[0]
    assert (task_b.queue, task_b.payload) == ("q2", b'{"n": 2}')  # A's result
    assert task_b.metadata["dtq.parent_task_id"] == r.task_id
    a = await get(broker_stub, r.task_id)
    assert (a.chain_state, a.next_task_id) == (pb.CHAIN_STATE_CONTINUED, task_b.task_id)
    await ack(broker_stub, task_b, b'{"n": 4}')
    task_c = await lease.next()
    assert (task_c.task_id, task_c.payload) == (r.chain_task_ids[1], b'{"fixed": true}')
    c = await get(broker_stub, task_c.task_id)
    assert (c.chain_id, c.chain_step, c.chain_state) == (r.task_id, 2,
                                                         pb.CHAIN_STATE_UNSPECIFIED)
    await ack(broker_stub, task_c)
    lease.close()


async def test_failed_step_breaks_the_chain(broker_stub, gateway):
    r = await broker_stub.Enqueue(enq(chain=[enq(task_type="never")]))
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    await fail(broker_stub, await lease.next())
    a = await get(broker_stub, r.task_id)
    assert (a.status, a.chain_state) == (pb.TASK_STATUS_DEAD_LETTERED, pb.CHAIN_STATE_BROKEN)
    gateway.followups.sweep_grace_ms = 0
    await gateway.followups.sweep()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await get(broker_stub, r.chain_task_ids[0])
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    lease.close()


async def test_sweep_creates_a_step_a_dead_gateway_owed(broker_stub, gateway):
    """The Ack lands through a Completion with no follow-up wiring, as when the gateway
    that took it died right after ack.lua: the leader's sweep creates the step."""
    gateway.followups.sweep_grace_ms = 0
    r = await broker_stub.Enqueue(enq(chain=[enq(task_type="b", payload=b"")]))
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    task_a = await lease.next()
    orphan = Completion(gateway.redis, gateway.settings,  # on_follow does nothing
                        keyring=gateway.keyring)
    (out,) = await orphan.ack([pb.AckItem(lease_id=task_a.lease_id, result=b"[7]")])
    assert (out.status, out.follow) == ("succeeded", "c"), out
    assert (await get(broker_stub, r.task_id)).chain_state == pb.CHAIN_STATE_CONTINUING
    task_b = await lease.next(timeout_s=10)  # the leader sweeps every 2 s
    assert (task_b.task_id, task_b.payload) == (r.chain_task_ids[0], b"[7]")
    assert (await gateway.followups.continue_chain("q", r.task_id)) == task_b.task_id
    assert (await gateway.followups.sweep())["chain_steps"] == 0  # nothing created twice
    lease.close()


async def test_batch_items_may_start_chains(broker_stub):
    resp = await broker_stub.EnqueueBatch(pb.EnqueueBatchRequest(items=[
        enq(chain=[enq(task_type="next")]), enq(), enq(chain=[enq(priority=99)])]))
    first, plain, bad = resp.results
    assert first.chain_task_ids == [step_task_id(first.task_id, "q")] and not plain.chain_task_ids
    assert bad.error.field == "items[2].chain[0].priority"
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    tasks = {t.task_id: t for t in await lease.take(2)}
    await ack(broker_stub, tasks[first.task_id])
    assert (await lease.next()).task_id == first.chain_task_ids[0]
    lease.close()


async def test_chain_step_validation_names_the_field(broker_stub):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await broker_stub.Enqueue(enq(chain=[enq(priority=12)]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_field(err.value) == "chain[0].priority"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await broker_stub.Enqueue(enq(chain=[enq(chain=[enq()])]))
    assert error_field(err.value) == "chain[0].chain"


async def test_group_callback_gets_every_outcome(broker_stub):
    resp = await broker_stub.EnqueueBatch(pb.EnqueueBatchRequest(
        items=[enq(task_type=f"m{i}") for i in range(3)],
        group_callback=enq(queue="cb", task_type="summary", payload=b"")))
    assert resp.group_callback_task_id == callback_task_id(resp.group_id, "cb")
    ids = [x.task_id for x in resp.results]
    assert all(ids)
    assert (await get(broker_stub, ids[0])).group_id == resp.group_id
    lease = await LeaseStream(broker_stub, "w1", ["q", "cb"]).open()
    tasks = {t.task_type: t for t in await lease.take(3)}
    await ack(broker_stub, tasks["m0"], b'{"ok": 0}')
    await fail(broker_stub, tasks["m1"])
    with pytest.raises(asyncio.TimeoutError):
        await lease.next(timeout_s=0.3)  # m2 still runs: no callback yet
    await ack(broker_stub, tasks["m2"], b"\xff")
    cb = await lease.next()
    assert (cb.task_id, cb.queue, cb.metadata["dtq.group_id"]) == \
        (resp.group_callback_task_id, "cb", resp.group_id)
    body = json.loads(cb.payload)
    assert body["group_id"] == resp.group_id
    by_id = {m["task_id"]: m for m in body["members"]}
    assert by_id[ids[0]]["status"] == "succeeded" and by_id[ids[0]]["result"] == {"ok": 0}
    assert (by_id[ids[1]]["status"], by_id[ids[1]]["error_class"]) == ("dead_lettered",
                                                                       "ValueError")
    assert by_id[ids[2]]["result_base64"] == "/w=="
    await ack(broker_stub, cb)
    lease.close()


async def test_group_members_ended_elsewhere_are_found_by_the_sweep(broker_stub, gateway,
                                                                    monkeypatch):
    # the leader's own pass (every 2 s) may find the group before this test's: count both
    finished: list[int] = []
    sweep = gateway.followups.sweep

    async def counted_sweep() -> dict[str, int]:
        counts = await sweep()
        finished.append(counts["groups_finished"])
        return counts

    monkeypatch.setattr(gateway.followups, "sweep", counted_sweep)
    resp = await broker_stub.EnqueueBatch(pb.EnqueueBatchRequest(
        items=[enq(task_type="m")], group_callback=enq(queue="cb", task_type="summary")))
    await broker_stub.CancelTask(pb.CancelTaskRequest(task_id=resp.results[0].task_id))
    await poll(lambda: gateway.followups.sweep(), lambda _: sum(finished) >= 1,
               timeout_s=10, interval_s=0.2)
    cb = await get(broker_stub, resp.group_callback_task_id)
    assert cb.payload == b"{}" and cb.metadata["dtq.group_id"] == resp.group_id


async def test_group_with_an_invalid_item_writes_nothing(broker_stub, gateway):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await broker_stub.EnqueueBatch(pb.EnqueueBatchRequest(
            items=[enq(), enq(queue="bad queue")], group_callback=enq(queue="cb")))
    assert error_field(err.value) == "items[1].queue"
    assert await gateway.redis.zcard("dtq:tasks:recent") == 0


async def test_group_callback_payload_leaves_out_results_past_its_budget(broker_stub, gateway):
    gateway.followups.groups.settings = replace(gateway.settings, max_payload_bytes=1000)
    resp = await broker_stub.EnqueueBatch(pb.EnqueueBatchRequest(
        items=[enq(task_type="m"), enq(task_type="m")],
        group_callback=enq(queue="cb", task_type="summary", payload=b"")))
    lease = await LeaseStream(broker_stub, "w1", ["q", "cb"]).open()
    small, big = await lease.take(2)
    await ack(broker_stub, small, b'"tiny"')
    await ack(broker_stub, big, json.dumps("x" * 600).encode())
    cb = await lease.next()
    assert cb.task_id == resp.group_callback_task_id
    by_id = {m["task_id"]: m for m in json.loads(cb.payload)["members"]}
    assert by_id[small.task_id]["result"] == "tiny"
    assert by_id[big.task_id]["result_omitted"] is True and "result" not in by_id[big.task_id]
    lease.close()


async def test_sweep_logs_a_lasting_depth_refusal_once(redis_url, caplog):
    """A chain step whose queue stays at its depth limit fails at every sweep: one
    warning, not one per sweep (the rest are counted for the next one)."""
    from dtq_gateway.server import Gateway
    from tests.conftest import gateway_settings

    gw = Gateway(gateway_settings(redis_url, max_queue_depth=1), redis_url)
    await gw.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
            stub = dtq_pb2_grpc.BrokerStub(ch)
            await stub.Enqueue(enq(queue="full"))  # "full" is at its depth limit now
            r = await stub.Enqueue(enq(chain=[enq(queue="full")]))
            lease = await LeaseStream(stub, "w1", ["q"]).open()
            await ack(stub, await lease.next())
            lease.close()
            await gw.followups.drain()
            gw.followups.sweep_grace_ms = 0
            caplog.set_level(logging.WARNING, logger="dtq_gateway.duties.followups")
            caplog.clear()
            for _ in range(5):
                assert (await gw.followups.sweep())["errors"] == 1
            warned = [rec for rec in caplog.records
                      if rec.getMessage().startswith("sweep: chain step failed")]
            assert len(warned) == 1, [rec.getMessage() for rec in warned]
            assert "QueueFull" in warned[0].getMessage()
            assert (await get(stub, r.task_id)).chain_state == pb.CHAIN_STATE_CONTINUING
    finally:
        await gw.stop()


def _dropped(reason: str) -> float:
    from prometheus_client import REGISTRY
    return REGISTRY.get_sample_value("dtq_progress_reports_dropped_total",
                                     {"reason": reason}) or 0.0


async def test_progress_reports_beyond_the_rate_are_dropped_and_counted(broker_stub, gateway):
    """A worker flooding progress reports gets 2 per lease per second applied (the
    documented rate); the rest are dropped, counted, and the lease is still extended."""
    from dtq_gateway.leasing.progress_limit import ProgressLimiter
    now = [1000.0]  # a frozen clock: the whole flood falls in one instant
    gateway.completion.progress_limiter = ProgressLimiter(clock=lambda: now[0])
    r = await broker_stub.Enqueue(enq())
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    task = await lease.next()
    rate_before, unlisted_before = _dropped("rate"), _dropped("unlisted")

    async def flood(first: int, count: int) -> None:
        # each heartbeat: 4 reports of the lease (the last one counts) + 1 of an unlisted one
        for i in range(first, first + count):
            reply = await broker_stub.Heartbeat(pb.HeartbeatRequest(
                worker_id="w1", lease_ids=[task.lease_id],
                progress=[pb.TaskProgress(lease_id=task.lease_id, percent=i, message=f"r{i}.{k}")
                          for k in range(4)] + [pb.TaskProgress(lease_id="other", percent=1)]))
            assert task.lease_id not in reply.lost_lease_ids

    await flood(1, 50)
    assert (await get(broker_stub, r.task_id)).progress_message == "r2.3"  # the burst of 2
    assert _dropped("rate") - rate_before == 48
    assert _dropped("unlisted") - unlisted_before == 50 * 4
    now[0] += 1.0  # a second later: 2 more tokens
    await flood(51, 5)
    assert (await get(broker_stub, r.task_id)).progress_message == "r52.3"
    assert _dropped("rate") - rate_before == 48 + 3
    await ack(broker_stub, task)
    lease.close()
