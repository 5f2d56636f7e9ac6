"""Retention proof: a mixed workload, then every ``dtq:*`` key against the layout table.

A gateway with short retention settings runs, through the real gRPC API with raw
stubs acting as the worker: a success, a retry then success, a dead letter, a
cancel of a queued and of an active task, an idempotent duplicate, a delayed task,
two expiries (past ``expires_at_ms`` at lease time, ``ttl_ms`` shorter than the
delay at the scheduler's move), pause/resume audit, heartbeats, and enough volume
to make the dead-letter stream, the audit stream and the recent-tasks zset trim.

During the run each transition is checked against the task record's TTL rule: a
live record has none, and the move to a terminal state starts the retention (the
probe lowers the TTL first, see ``TtlProbe``); terminal updates are checked to keep
the idempotency TTL. Afterwards SCAN walks every key: each must match exactly one
row of docs/redis-layout.md, with the row's type and bound.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import grpc
import pytest
import redis.asyncio as aioredis

from dtq_gateway.server import Gateway
from dtq_gateway.settings import Settings
from dtq_gateway.store import keys
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.conftest import gateway_settings
from tests.system import retention_support as rs
from tests.system.retention_support import Bounds, TtlProbe
from tests.system.retention_worker import RawWorker

Q, BULK, FOLLOW = "ret", "ret-bulk", "ret-follow"
#: Dead letters and audit entries written in bulk: far above the small MAXLENs.
BULK_N = 250
SETTINGS = {"task_retention_s": 600, "result_retention_s": 300, "idem_ttl_s": 900,
            "dlq_maxlen": 10, "audit_maxlen": 10, "recent_max": 5,
            "heartbeat_interval_s": 1.0, "visibility_timeout_s": 10}
#: Idempotency state the record must hold for each terminal task status.
IDEM_STATE = {b"succeeded": "completed", b"dead_lettered": "failed",
              b"cancelled": "failed", b"expired": "failed"}


@dataclass
class Env:
    """The gateway under test and the clients the workload uses."""

    settings: Settings
    r: aioredis.Redis
    broker: dtq_pb2_grpc.BrokerStub
    admin: dtq_pb2_grpc.AdminStub
    task_probe: TtlProbe
    idem_probe: TtlProbe
    worker: RawWorker | None = None

    async def status(self, task_id: str) -> bytes | None:
        """The task hash's status field, read from Redis."""
        return await self.r.hget(keys.task(task_id), "status")

    async def get(self, task_id: str) -> pb.Task:
        """GetTask over gRPC."""
        return (await self.broker.GetTask(pb.GetTaskRequest(task_id=task_id))).task


@pytest.fixture
async def env(redis_url):
    settings = gateway_settings(redis_url, **SETTINGS)
    gw = Gateway(settings, redis_url)
    await gw.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}")
    r = aioredis.Redis.from_url(redis_url)
    e = Env(settings, r, dtq_pb2_grpc.BrokerStub(channel), dtq_pb2_grpc.AdminStub(channel),
            TtlProbe(r, settings.task_retention_s * 1000, marker_ms=60_000),
            TtlProbe(r, settings.idem_ttl_s * 1000, marker_ms=100_000))
    yield e
    if e.worker:
        await e.worker.stop()
    await channel.close()
    await gw.stop()
    await r.aclose()


def enq(queue: str = Q, **kw) -> pb.EnqueueRequest:
    return pb.EnqueueRequest(queue=queue, task_type="t.ret", payload=b"{}", **kw)


def test_layout_table_and_key_builders_agree():
    rows = rs.layout_rows()
    families = rs.key_families()
    assert len(rows) == len(families) == len(rs.FAMILY_EXAMPLES), (
        f"docs/redis-layout.md has {len(rows)} key rows, expected one per family "
        f"{sorted(rs.FAMILY_EXAMPLES)}")
    assert families["events-channel"].redis_type == "", "dtq:events must be a channel row"
    for name in ("dead-letter", "audit", "worker", "idempotency"):
        assert families[name].fields, f"no field list parsed from the {name} row"
    assert {"task_id", "attempt", "idempotency_key"} <= rs.entry_fields(), \
        "stream entry fields not parsed from docs/design.md"


async def _enqueue_scenarios(e: Env) -> dict[str, str]:
    """Enqueue every scenario while the queue is paused; check the fresh TTLs."""
    changed = (await e.admin.PauseQueue(pb.PauseQueueRequest(queue=Q, reason="retention", create=True)))
    assert changed.changed and await e.r.exists(keys.paused(Q)), "pause flag not set"
    past = await rs.now_ms(e.r) - 1000
    reqs = {"success": enq(), "retry": enq(max_attempts=3),
            "dead": enq(idempotency_key="dead-key"),
            "cancel_queued": enq(idempotency_key="cq-key"), "cancel_active": enq(),
            "idem": enq(idempotency_key="dup-key"),
            "expired_past": enq(expires_at_ms=past, idempotency_key="exp-key"),
            "delayed": enq(delay_ms=300), "expired_delayed": enq(delay_ms=1500, ttl_ms=100)}
    ids = {}
    for name, req in reqs.items():
        resp = await e.broker.Enqueue(req)
        want = pb.TASK_STATUS_SCHEDULED if req.delay_ms else pb.TASK_STATUS_QUEUED
        assert resp.status == want, f"{name}: enqueue answered {resp.status}"
        ids[name] = resp.task_id
        await e.task_probe.assert_live(keys.task(resp.task_id), f"enqueue of {name}")
        if req.idempotency_key:
            await e.idem_probe.assert_live(_idem_key(req), f"idempotency record of {name}")
    problems = await rs.field_problems(e.r, keys.stream(Q, 5), rs.entry_fields())
    assert not problems, f"band-stream entries differ from docs/design.md: {problems}"
    await e.task_probe.mark(keys.task(ids["expired_delayed"]))
    assert await e.status(ids["expired_delayed"]) == b"scheduled", \
        "expired_delayed moved before its TTL marker was set (delay too short here)"
    return ids


def _idem_key(req: pb.EnqueueRequest) -> str:
    return keys.idempotency(req.queue, keys.idempotency_digest(req.idempotency_key))


async def _duplicate_and_queued_cancel(e: Env, ids: dict[str, str]) -> None:
    """The duplicate keeps the idempotency TTL; a queued cancel refreshes the hash."""
    dup_key = _idem_key(enq(idempotency_key="dup-key"))
    await e.idem_probe.mark(dup_key)
    again = await e.broker.Enqueue(enq(idempotency_key="dup-key"))
    assert (again.task_id, again.deduplicated) == (ids["idem"], True), \
        f"duplicate enqueue answered {again}"
    await e.idem_probe.assert_kept(dup_key, "duplicate enqueue")
    for key in ("dead-key", "cq-key", "exp-key"):  # terminal updates must keep these TTLs
        await e.idem_probe.mark(_idem_key(enq(idempotency_key=key)))
    cq = ids["cancel_queued"]
    async with e.task_probe.refreshed(keys.task(cq), "cancel of a queued task"):
        resp = await e.broker.CancelTask(pb.CancelTaskRequest(task_id=cq, reason="ret"))
    assert resp.status == pb.TASK_STATUS_CANCELLED, f"queued cancel answered {resp}"
    assert not await e.r.sismember(keys.cancelled(Q), cq), \
        "an unread queued entry is deleted at the cancel, not parked in the cancelled set"
    assert not await e.r.hget(keys.task(cq), "entry_id"), "cancelled task keeps an entry id"
    assert not await rs.orphaned_cancels(e.r), "cancelled set names a task without entry"
    audit = await e.r.xrevrange(keys.AUDIT, count=1)
    assert audit and audit[0][1][b"action"] == b"cancel_task" and \
        audit[0][1][b"task_id"] == cq.encode(), f"cancel not audited: {audit}"


async def _lease_after_resume(e: Env, ids: dict[str, str]) -> None:
    """Resume; activation leaves records live, expiry at lease time starts the retention."""
    active = ["success", "retry", "dead", "cancel_active", "idem", "expired_past"]
    resp = await e.admin.ResumeQueue(pb.ResumeQueueRequest(queue=Q, reason="retention"))
    assert resp.changed and not await e.r.exists(keys.paused(Q)), "pause flag left"
    await e.worker.wait_leased({ids[n] for n in active[:-1] + ["delayed"]})
    for name in active[:-1]:
        await e.task_probe.assert_live(keys.task(ids[name]), f"lease of {name}")
    await rs.wait_until(lambda: e.status(ids["expired_past"]), lambda s: s == b"expired",
                        "task past expires_at_ms not expired")
    # expired by the scheduler leader's expiry sweep (even while the queue was paused)
    # or at lease time: either way the record, live without a TTL, got the retention then
    expired = keys.task(ids["expired_past"])
    finished = int(await e.r.hget(expired, "finished_at_ms"))
    since = await rs.now_ms(e.r) - finished
    pttl = await e.r.pttl(expired)
    retention = e.task_probe.retention_ms
    assert retention - e.task_probe.slack_ms - since < pttl <= retention, (
        f"expiry: PTTL of {expired} is {pttl} ms {since} ms after it expired, expected "
        f"the retention {retention} ms set then")


async def _finish_leases(e: Env, ids: dict[str, str]) -> None:
    """Ack, dead-letter and cancel the active tasks; each transition refreshes."""
    w, probe = e.worker, e.task_probe
    async with probe.refreshed(keys.task(ids["success"]), "ack"):
        await w.ack(ids["success"], result=b'{"n":1}')
    await TtlProbe(e.r, e.settings.result_retention_s * 1000, 0).assert_fresh(
        keys.result(ids["success"]), "result written by ack")
    async with probe.refreshed(keys.task(ids["idem"]), "ack of the idempotent task"):
        await w.ack(ids["idem"])
    async with probe.refreshed(keys.task(ids["dead"]), "non-retryable fail"):
        res = await w.fail([ids["dead"]], retryable=False)
    assert res[0].status == pb.TASK_STATUS_DEAD_LETTERED, f"dead letter answered {res[0]}"
    ca = ids["cancel_active"]
    async with probe.persisted(keys.task(ca), "cancel of an active task"):
        resp = await e.broker.CancelTask(pb.CancelTaskRequest(task_id=ca))
    assert resp.cancel_requested and resp.status == pb.TASK_STATUS_ACTIVE, f"{resp}"
    await rs.wait_until(w.heartbeat, lambda _: ca in w.cancelled,
                        "heartbeat never reported the cancellation", timeout_s=5)
    async with probe.refreshed(keys.task(ca), "fail(cancelled)"):
        res = await w.fail([ca], mode=pb.FAIL_MODE_CANCELLED)
    assert res[0].status == pb.TASK_STATUS_CANCELLED, f"cancelled fail answered {res[0]}"
    delayed = await e.get(ids["delayed"])
    assert delayed.started_at_ms >= delayed.created_at_ms + 300, "delay not honoured"
    await w.ack(ids["delayed"])


async def _retry_then_success(e: Env, task_id: str) -> None:
    """Fail retryable and the scheduler's move keep the record live (dropping a TTL),
    the second lease leaves it live, the ack starts the retention."""
    key = keys.task(task_id)
    await e.admin.PauseQueue(pb.PauseQueueRequest(queue=Q))  # hold the retry in its band
    async with e.task_probe.persisted(key, "retryable fail"):
        res = await e.worker.fail([task_id], retry_after_ms=1000)
    assert res[0].status == pb.TASK_STATUS_SCHEDULED, f"retry answered {res[0]}"
    await e.task_probe.mark(key)
    assert await e.status(task_id) == b"scheduled", "retry moved before its TTL marker"
    await rs.wait_until(lambda: e.status(task_id), lambda s: s == b"queued",
                        "scheduler did not move the due retry", timeout_s=5)
    await e.task_probe.assert_live(key, "scheduler move of a due retry")
    await e.admin.ResumeQueue(pb.ResumeQueueRequest(queue=Q))
    await e.worker.wait_leased({task_id})
    assert e.worker.held[task_id].attempt == 2, "retry leased with the wrong attempt"
    await e.task_probe.assert_live(key, "lease of the retry")
    async with e.task_probe.refreshed(key, "ack of the retry"):
        await e.worker.ack(task_id)


async def _check_idempotency_kept(e: Env, ids: dict[str, str]) -> None:
    """Terminal updates set the expiry the enqueue recorded: enqueue + DTQ_IDEM_TTL_S
    (the record had no TTL while its task was live; a marker TTL set meanwhile is gone)."""
    for name, key, state in (("idem", "dup-key", "completed"), ("dead", "dead-key", "failed"),
                             ("cancel_queued", "cq-key", "failed"),
                             ("expired_past", "exp-key", "failed")):
        idem = _idem_key(enq(idempotency_key=key))
        rec = json.loads(await e.r.get(idem))
        assert (rec["task_id"], rec["state"]) == (ids[name], state), \
            f"idempotency record of {name}: {rec}, expected state {state}"
        created = int(await e.r.hget(keys.task(ids[name]), "created_at_ms"))
        assert rec["expires_at_ms"] == created + e.settings.idem_ttl_s * 1000, \
            f"idempotency record of {name}: expires_at_ms is not enqueue + DTQ_IDEM_TTL_S"
        pttl, now = await e.r.pttl(idem), await rs.now_ms(e.r)
        assert abs(pttl - (rec["expires_at_ms"] - now)) < 1500, \
            f"terminal update of {name}: PTTL {pttl} ms, expected expires_at_ms - now"


async def _workers(e: Env) -> None:
    """Heartbeats reset the worker TTL to 3 x the interval; the sweep forgets expiry."""
    hb_ms = e.settings.heartbeat_interval_ms
    assert e.settings.worker_ttl_ms == 3 * hb_ms
    key = keys.worker(e.worker.worker_id)
    probe = TtlProbe(e.r, 3 * hb_ms, marker_ms=hb_ms // 2, slack_ms=hb_ms)
    async with probe.refreshed(key, "worker heartbeat"):
        await e.worker.heartbeat()
    await e.broker.Heartbeat(pb.HeartbeatRequest(worker_id="w-gone", hostname="h"))
    assert await e.r.sismember(keys.WORKERS, "w-gone"), "heartbeat did not register w-gone"
    await e.r.pexpire(keys.worker("w-gone"), 1)  # as if it had stopped beating 3 s ago
    await rs.wait_until(lambda: e.r.sismember(keys.WORKERS, "w-gone"), lambda m: not m,
                        "sweep kept a worker whose hash expired",
                        timeout_s=5 * e.settings.heartbeat_interval_s)


async def _follow_ups(e: Env) -> list[str]:
    """A chain of two and a group of two with its callback, run to their end: their
    pending sets must be gone and the group record must carry the task retention."""
    chain = await e.broker.Enqueue(enq(queue=FOLLOW, chain=[enq(queue=FOLLOW)]))
    group = await e.broker.EnqueueBatch(pb.EnqueueBatchRequest(
        items=[enq(queue=FOLLOW), enq(queue=FOLLOW)], group_callback=enq(queue=FOLLOW)))
    ids = [chain.task_id, *chain.chain_task_ids, *(r.task_id for r in group.results),
           group.group_callback_task_id]
    w = await RawWorker(e.broker, "w-follow", [FOLLOW], 1.0).start()
    try:
        for batch in ([ids[0], *ids[2:4]], [ids[1], ids[4]]):  # the steps, then the rest
            await w.wait_leased(set(batch))
            for task_id in batch:
                await w.ack(task_id)
    finally:
        await w.stop()
    return ids


async def _bulk(e: Env) -> list[str]:
    """Write far more dead letters, audit entries and tasks than the MAXLENs allow."""
    resp = await e.broker.EnqueueBatch(pb.EnqueueBatchRequest(
        items=[enq(queue=BULK, max_attempts=1) for _ in range(BULK_N)]))
    ids = [res.task_id for res in resp.results]
    assert all(ids), f"bulk enqueue refused items: {[r.error for r in resp.results][:3]}"
    bulk = await RawWorker(e.broker, "w-bulk", [BULK], 1.0, max_in_flight=BULK_N).start()
    try:
        await bulk.wait_leased(set(ids))
        await bulk.fail(ids, retryable=False)
    finally:
        await bulk.stop()
    for _ in range(BULK_N // 2):
        await e.admin.PauseQueue(pb.PauseQueueRequest(queue=BULK))
        await e.admin.ResumeQueue(pb.ResumeQueueRequest(queue=BULK))
    return ids


async def _check_trimmed(e: Env, bounds: Bounds) -> None:
    """Dead-letter and audit streams stay near MAXLEN; recent tasks exactly at most."""
    for key, maxlen in ((keys.dead_letter(BULK), bounds.dlq_maxlen),
                        (keys.AUDIT, bounds.audit_maxlen)):
        info = await e.r.xinfo_stream(key)
        added, length = int(info["entries-added"]), int(info["length"])
        assert added >= BULK_N, f"{key}: only {added} entries written, test too small"
        assert length <= maxlen + bounds.node_max, (
            f"{key}: XLEN {length} after {added} XADDs; MAXLEN ~{maxlen} allows at most "
            f"{maxlen} + one radix node ({bounds.node_max})")
    recent = await e.r.zcard(keys.RECENT_TASKS)
    assert recent == bounds.recent_max, \
        f"recent-tasks zset has {recent} members, DTQ_RECENT_MAX is {bounds.recent_max}"


async def _wait_terminal(e: Env, task_ids: list[str]) -> None:
    """Poll GetTask until every task is terminal (deadline 10 s)."""
    async def open_tasks() -> list[str]:
        tasks = await asyncio.gather(*(e.get(t) for t in task_ids))
        return [t.task_id for t in tasks if t.status not in rs.TERMINAL]
    await rs.wait_until(open_tasks, lambda left: not left, "tasks not terminal")


async def _bounds(e: Env) -> Bounds:
    s = e.settings
    node_max = int((await e.r.config_get("stream-node-max-entries"))["stream-node-max-entries"])
    return Bounds(task_ms=s.task_retention_s * 1000, result_ms=s.result_retention_s * 1000,
                  idem_ms=s.idem_ttl_s * 1000, worker_ms=3 * s.heartbeat_interval_ms,
                  lock_ms=10_000, dlq_maxlen=s.dlq_maxlen, audit_maxlen=s.audit_maxlen,
                  recent_max=s.recent_max, node_max=node_max)


async def _walk(e: Env, bounds: Bounds, all_ids: list[str]) -> None:
    """SCAN every key; each family against its row of the table."""
    families = rs.key_families()
    inv = await rs.inventory(e.r, families)
    assert not await rs.orphaned_cancels(e.r), "cancelled set names tasks without entry"
    for family in ("events-channel", "retry-claimed", "paused", "retry-schedule", "cancelled",
                   "chain-pending", "groups-pending"):
        assert not inv[family], f"{family} keys left at rest: {inv[family]}"
    assert len(inv["band-stream"]) >= 2, f"band streams missing: {inv['band-stream']}"
    problems = await rs.stream_rest_problems(e.r, inv["band-stream"])
    assert not problems, f"band streams not empty at rest: {problems}"
    assert sorted(inv["task"]) == sorted(keys.task(t) for t in all_ids), \
        "task hashes differ from the tasks enqueued (one expired early, or a stray hash)"
    problems = await rs.task_hash_problems(e.r, inv["task"], bounds.task_ms)
    assert not problems, f"task hash TTLs not set by their last update: {problems}"
    for family, high in (("result", bounds.result_ms), ("idempotency", bounds.idem_ms),
                         ("group", bounds.task_ms),
                         ("worker", bounds.worker_ms), ("scheduler-lock", bounds.lock_ms)):
        assert inv[family], f"no {family} key: the workload should have written one"
        problems = await rs.ttl_problems(e.r, inv[family], 0, high)
        assert not problems, f"{family} TTLs outside (0, {high}] ms: {problems}"
    await _check_trimmed(e, bounds)
    await _check_records(e, inv)
    await _check_fields(e, inv, families)


async def _check_fields(e: Env, inv: dict[str, list[str]],
                        families: dict[str, rs.Family]) -> None:
    """Entries, worker hashes and idempotency records hold the fields the table lists."""
    dlq = rs.entry_fields() | families["dead-letter"].fields
    for stream, expected in ((keys.dead_letter(BULK), dlq),
                             (keys.AUDIT, families["audit"].fields)):
        problems = await rs.field_problems(e.r, stream, expected)
        assert not problems, f"entries differ from the layout table: {problems}"
    for key in inv["worker"]:
        names = {"leasing@<tag>" if f.startswith(b"leasing@") else f.decode()
                 for f in await e.r.hkeys(key)}
        extra = names - families["worker"].fields
        assert not extra, f"{key} holds fields the layout table does not list: {extra}"
    for key in inv["idempotency"]:
        got = set(json.loads(await e.r.get(key)))
        assert got == families["idempotency"].fields, f"{key} holds JSON fields {got}"


async def _check_records(e: Env, inv: dict[str, list[str]]) -> None:
    """Results belong to succeeded tasks; idempotency records agree with their task."""
    for key in inv["result"]:
        task_id = key.rsplit(":", 1)[1]
        status = await e.status(task_id)
        assert status == b"succeeded", f"{key} kept for a task in status {status}"
    for key in inv["idempotency"]:
        rec = json.loads(await e.r.get(key))
        task = await e.r.hmget(keys.task(rec["task_id"]), "status", "queue", "idem_key")
        queue, text = task[1].decode(), task[2].decode()
        # a client key's digest, or (schedule fires, chain steps, callbacks) an internal one
        assert key in (keys.idempotency(queue, keys.idempotency_digest(text)),
                       keys.idempotency(queue, keys.internal_idempotency_digest(text))), \
            f"{key} names another queue/key than task {rec['task_id']}"
        assert rec["state"] == IDEM_STATE.get(task[0]), \
            f"{key}: state {rec['state']} for a task in status {task[0]}"


async def test_mixed_workload_leaves_only_bounded_keys(env: Env):
    ids = await _enqueue_scenarios(env)
    env.worker = await RawWorker(env.broker, "w-ret", [Q],
                                 env.settings.heartbeat_interval_s).start()
    await _duplicate_and_queued_cancel(env, ids)
    await _lease_after_resume(env, ids)
    await _finish_leases(env, ids)
    await _retry_then_success(env, ids["retry"])
    await rs.wait_until(lambda: env.status(ids["expired_delayed"]), lambda s: s == b"expired",
                        "task whose ttl_ms ran out during its delay not expired")
    await env.task_probe.assert_fresh(keys.task(ids["expired_delayed"]),
                                      "expiry at the scheduler's move")
    await _check_idempotency_kept(env, ids)
    follow_ids = await _follow_ups(env)
    bulk_ids = await _bulk(env)
    await _workers(env)
    all_ids = list(ids.values()) + follow_ids + bulk_ids
    await _wait_terminal(env, all_ids)
    await _walk(env, await _bounds(env), all_ids)
