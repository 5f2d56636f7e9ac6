"""The dashboard's history, schedules, rate limits and task-links endpoints over HTTP,
against an in-process gateway and real Redis; and the history sampler's arithmetic."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
import redis.asyncio as aioredis

from dtq_gateway.store import history
from dtq_proto import dtq_pb2
from tests.support.dashboard import dashboard_gateway
from tests.support.leasing import poll

ADMIN, PRODUCER = "admin-token-1", "producer-token-1"
TOKENS = f"{ADMIN}=admin:alice,{PRODUCER}=producer:bob"


async def _json(session: aiohttp.ClientSession, method: str, url: str, **kw):
    async with session.request(method, url, **kw) as resp:
        return resp.status, await resp.json()


@pytest.mark.parametrize(("method", "path", "body", "status", "field"), [
    ("GET", "/api/history?minutes=0", None, 400, "minutes"),
    ("GET", "/api/history?minutes=lots", None, 400, "minutes"),
    ("GET", "/api/history?queue=%3Cb%3E", None, 400, "queue"),
    ("GET", "/api/schedules?page_size=0", None, 400, "page_size"),
    ("GET", "/api/rate-limits?queue=a%20b", None, 400, "queue"),
    ("GET", "/api/rate-limits?page_token=nope", None, 400, "page_token"),
    ("POST", "/api/schedules/none-such/pause", {}, 404, "name"),
    ("POST", "/api/schedules/none-such/trigger", {}, 404, "name"),
    ("POST", "/api/schedules/bad%20name/delete", {}, 400, "name"),
    ("POST", "/api/rate-limits", {"queue": "q", "limit": "ten"}, 400, "rate_limit.limit"),
    ("POST", "/api/rate-limits", {"queue": "q", "limit": 0}, 400, "rate_limit.limit"),
    ("POST", "/api/rate-limits", {"queue": "q", "limit": 5, "task_type": 7}, 400,
     "rate_limit.task_type"),
    ("POST", "/api/rate-limits", {"queue": "<q>", "limit": 5}, 400, "rate_limit.queue"),
    ("POST", "/api/rate-limits/delete", {"queue": "a b"}, 400, "queue"),
    ("GET", "/api/tasks/not-an-id/links", None, 400, "task_id"),
    ("GET", "/api/tasks/" + "0" * 32 + "/links", None, 404, "task_id"),
])
async def test_bad_input_names_the_field_and_changes_nothing(redis_url, method, path, body,
                                                             status, field):
    async with dashboard_gateway(redis_url) as dg, aiohttp.ClientSession() as http:
        kw = {"json": body} if body is not None else {}
        got, reply = await _json(http, method, dg.url + path, **kw)
        assert got == status, reply
        assert reply["error"]["field"] == field, reply
        assert "Traceback" not in json.dumps(reply)
        limits = await dg.admin.ListRateLimits(dtq_pb2.ListRateLimitsRequest())
        assert list(limits.rate_limits) == []
        audit = await dg.admin.ListAudit(dtq_pb2.ListAuditRequest())
        assert list(audit.entries) == []


async def test_new_endpoints_need_an_admin_token_and_audit_its_identity(redis_url):
    async with dashboard_gateway(redis_url, auth_tokens=TOKENS) as dg, \
            aiohttp.ClientSession() as http:
        await dg.admin.CreateSchedule(dtq_pb2.CreateScheduleRequest(schedule=dtq_pb2.Schedule(
            name="hourly", interval_ms=3_600_000,
            task=dtq_pb2.EnqueueRequest(queue="q", task_type="t"))))
        task_id = await dg.enqueue("q", "t", {})
        calls = [("GET", "/api/history"), ("GET", "/api/schedules"),
                 ("GET", "/api/rate-limits"), ("GET", f"/api/tasks/{task_id}/links"),
                 ("POST", "/api/schedules/hourly/pause"),
                 ("POST", "/api/rate-limits"), ("POST", "/api/rate-limits/delete")]
        for method, path in calls:
            status, reply = await _json(http, method, dg.url + path, json={})
            assert status == 401 and reply["error"]["code"] == "UNAUTHENTICATED", path
            status, reply = await _json(http, method, dg.url + path, json={},
                                        headers={"Authorization": f"Bearer {PRODUCER}"})
            assert status == 403 and reply["error"]["code"] == "PERMISSION_DENIED", path
        admin = {"Authorization": f"Bearer {ADMIN}"}
        status, reply = await _json(http, "POST", dg.url + "/api/schedules/hourly/pause",
                                    json={}, headers={**admin, "X-Request-Id": "req-7"})
        assert status == 200 and reply["schedule"]["paused"] is True
        assert reply["schedule"]["next_fire_ms"] == 0
        status, reply = await _json(http, "POST", dg.url + "/api/rate-limits",
                                    json={"queue": "q", "limit": 3}, headers=admin)
        assert status == 200 and reply["created"] is True
        assert reply["rate_limit"] == {"queue": "q", "task_type": "", "limit": 3,
                                       "period_ms": 1000, "burst": 3, "tokens": 0.0}
        audit = await dg.admin.ListAudit(dtq_pb2.ListAuditRequest())
        got = [(a.action, a.actor, a.task_id, a.request_id) for a in audit.entries]
        assert ("pause_schedule", "alice", "hourly", "req-7") in got
        assert ("set_rate_limit", "alice", "q", reply["request_id"]) in got
        # a cross-site form cannot act
        status, reply = await _json(http, "POST", dg.url + "/api/schedules/hourly/delete",
                                    json={}, headers={**admin, "Origin": "http://evil.example"})
        assert status == 403 and reply["error"]["reason"] == "BAD_ORIGIN"
        got = await dg.admin.GetSchedule(dtq_pb2.GetScheduleRequest(name="hourly"))
        assert got.schedule.schedule.name == "hourly"


async def test_rate_limits_are_paged(redis_url):
    async with dashboard_gateway(redis_url) as dg, aiohttp.ClientSession() as http:
        for i in range(5):
            await dg.admin.SetRateLimit(dtq_pb2.SetRateLimitRequest(
                rate_limit=dtq_pb2.RateLimit(queue=f"q{i}", limit=i + 1)))
        seen, token = [], ""
        while True:
            status, page = await _json(http, "GET", dg.url + "/api/rate-limits?page_size=2"
                                       + (f"&page_token={token}" if token else ""))
            assert status == 200 and len(page["rate_limits"]) <= 2
            seen += [(r["queue"], r["limit"]) for r in page["rate_limits"]]
            token = page["next_page_token"]
            if not token:
                break
        assert seen == [(f"q{i}", i + 1) for i in range(5)]


async def test_task_links_of_a_plain_task_are_null(redis_url):
    async with dashboard_gateway(redis_url) as dg, aiohttp.ClientSession() as http:
        task_id = await dg.enqueue("q", "t", {})
        status, links = await _json(http, "GET", dg.url + f"/api/tasks/{task_id}/links")
        assert status == 200 and links == {"task_id": task_id, "chain": None, "group": None}


async def test_history_is_shared_survives_a_restart_and_is_bounded(redis_url):
    """One gateway samples; two others, started after it stopped, serve the same
    samples. Each list is trimmed to DTQ_HISTORY_POINTS and expires after points x
    interval."""
    async with dashboard_gateway(redis_url, history_interval_s=0.5, history_points=6) as dg, \
            aiohttp.ClientSession() as http:
        await dg.enqueue("shared", "t", {})
        redis = dg.gateway.redis
        await poll(lambda: redis.llen("dtq:history:{shared}"), lambda n: n >= 6, 60, 0.1)
        newest = await redis.lindex("dtq:history", 0)
        await poll(lambda: redis.lindex("dtq:history", 0), lambda v: v != newest,  # one more
                   60, 0.1)
        assert await redis.llen("dtq:history:{shared}") == 6
        assert await redis.llen("dtq:history") == 6
        assert 0 < await redis.pttl("dtq:history:{shared}") <= 6 * 500
        before = (await _json(http, "GET", f"{dg.url}/api/history?queue=shared"))[1]
    async with dashboard_gateway(redis_url, history_interval_s=3600, history_points=6) as b, \
            dashboard_gateway(redis_url, history_interval_s=3600, history_points=6) as c, \
            aiohttp.ClientSession() as http:
        (_, from_b), (_, from_c) = await asyncio.gather(*(_json(
            http, "GET", f"{g.url}/api/history?queue=shared") for g in (b, c)))
    assert from_b == from_c
    assert len(from_b["points"]) == 6
    assert before["points"][-1] in from_b["points"]


async def test_samples_count_each_outcome_once_and_hide_their_baselines(redis_url):
    """Two samples around a load count exactly the outcomes between them; the baseline
    fields the sampler keeps in the counters hash do not show in GetQueueStats."""
    async with dashboard_gateway(redis_url, history_interval_s=3600) as dg:
        r = aioredis.from_url(redis_url)
        try:
            await poll(lambda: r.exists("dtq:history"), bool, 30, 0.05)  # the first sample
            first = await history.take_sample(r, ["work"], 0, 1_000, 10, 60_000)
            assert first["work"]["succeeded"] == 0
            for i in range(3):
                await dg.succeed("work", "t", {"i": i}, {})
            await dg.dead_letter("work", "t", {}, "boom")
            sec, usec = await r.time()
            now = int(sec) * 1000 + int(usec) // 1000 + 1
            second = await history.take_sample(r, ["work"], now - 60_000, now, 10, 60_000)
            assert (second["work"]["succeeded"], second["work"]["failed"],
                    second["work"]["dead_lettered"], second["work"]["enqueued"]) == (3, 1, 1, 4)
            assert second[""]["succeeded"] == 3 and second[""]["enqueued"] == 4
            assert len(second["work"]["run_ms"]) == 3  # p50, p95, p99
            third = await history.take_sample(r, ["work"], now, now + 1, 10, 60_000)
            assert (third["work"]["succeeded"], third["work"]["failed"]) == (0, 0)
            stats = await dg.admin.GetQueueStats(dtq_pb2.GetQueueStatsRequest(queue="work"))
            assert (stats.succeeded, stats.failed, stats.dead_lettered) == (3, 1, 1)
            assert await r.llen("dtq:history:{work}") == 3
            assert 0 < await r.pttl("dtq:history:{work}") <= 60_000
            assert [p["t"] for p in await history.read(r, "work", 10)] == [1_000, now, now + 1]
        finally:
            await r.aclose()


async def test_a_counters_hash_that_does_not_exist_is_not_made(redis_url):
    r = aioredis.from_url(redis_url)
    try:
        await history.take_sample(r, ["ghost"], 0, 1_000, 10, 60_000)
        assert not await r.exists("dtq:queue:{ghost}:counters")
    finally:
        await r.aclose()


def test_percentiles_nearest_rank():
    assert history.percentiles([]) == []
    assert history.percentiles([5]) == [5, 5, 5]
    assert history.percentiles(list(range(1, 101))) == [50, 95, 99]
    assert history.percentiles([10, 1, 3, 2]) == [2, 10, 10]
