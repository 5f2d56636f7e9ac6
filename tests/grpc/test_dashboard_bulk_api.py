"""The dashboard API's bulk cancel, purge and search over HTTP (real gateway, Redis)."""

from __future__ import annotations

import aiohttp
import pytest

from dtq_proto import dtq_pb2
from tests.support.dashboard import dashboard_gateway


async def _json(session: aiohttp.ClientSession, method: str, url: str, **kw):
    async with session.request(method, url, **kw) as resp:
        return resp.status, await resp.json()


async def test_cancel_matching_purge_and_search(redis_url):
    async with dashboard_gateway(redis_url) as dg, aiohttp.ClientSession() as http:
        eu = [await dg.enqueue("mail", "send", {"n": i}, metadata={"region": "eu"})
              for i in range(2)]
        us = await dg.enqueue("mail", "send", {"n": 5}, metadata={"region": "us"})
        status, found = await _json(http, "POST", dg.url + "/api/search", json={
            "filter": {"metadata": {"region": "us"}, "statuses": ["QUEUED"]}})
        assert status == 200 and [t["task_id"] for t in found["tasks"]] == [us]
        assert found["tasks"][0]["status"] == "QUEUED" and found["next_page_token"] == ""
        flt = {"queue": "mail", "metadata": {"region": "eu"}}
        status, dry = await _json(http, "POST", dg.url + "/api/tasks/cancel-matching",
                                  json={"filter": flt, "dry_run": True})
        assert status == 200 and (dry["matched"], dry["cancelled"]) == (2, 0)
        status, done = await _json(http, "POST", dg.url + "/api/tasks/cancel-matching",
                                   json={"filter": flt})
        assert status == 200 and sorted(done["task_ids"]) == sorted(eu)
        status, purged = await _json(http, "POST", dg.url + "/api/queues/mail/purge",
                                     json={"reason": "r"})
        assert status == 200 and purged["cancelled"] == 1
        got = await dg.broker.GetTask(dtq_pb2.GetTaskRequest(task_id=us))
        assert got.task.status == dtq_pb2.TASK_STATUS_CANCELLED
        status, audit = await _json(http, "GET", dg.url + "/api/audit")
        assert [e["action"] for e in audit["entries"][:3]] == [
            "purge_queue", "cancel_tasks", "cancel_tasks"]


@pytest.mark.parametrize("path,body,field", [
    ("/api/tasks/cancel-matching", {"filter": {}}, "filter.queue"),
    ("/api/tasks/cancel-matching", {"filter": {"queue": "mail", "statuses": ["SUCCEEDED"]}},
     "filter.statuses"),
    ("/api/tasks/cancel-matching", {"filter": {"queue": "mail", "metadata": {"a": 1}}},
     "filter.metadata"),
    ("/api/search", {"filter": {"statuses": ["NOPE"]}}, "filter.statuses"),
    ("/api/search", {"page_token": "x"}, "page_token"),
    ("/api/queues/a:b/purge", {}, "queue"),
    # valid JSON escapes that are no Unicode text (lone surrogates): 400, not INTERNAL
    ("/api/search", {"filter": {"queue": "\ud800"}}, "filter.queue"),
    ("/api/tasks/cancel-matching",
     {"filter": {"queue": "mail", "metadata": {"k": "\ud800"}}, "dry_run": True},
     "filter.metadata.k"),
    ("/api/queues/mail/pause", {"reason": "\udfff"}, "reason")])
async def test_bad_input_is_400_naming_the_field(redis_url, path, body, field):
    async with dashboard_gateway(redis_url) as dg, aiohttp.ClientSession() as http:
        tid = await dg.enqueue("mail", "send", {"n": 1})
        status, err = await _json(http, "POST", dg.url + path, json=body)
        assert status == 400 and err["error"]["field"] == field
        got = await dg.broker.GetTask(dtq_pb2.GetTaskRequest(task_id=tid))
        assert got.task.status == dtq_pb2.TASK_STATUS_QUEUED
