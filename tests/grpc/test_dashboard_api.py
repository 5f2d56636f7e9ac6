"""The dashboard's JSON API over HTTP, against an in-process gateway and real Redis.

Tasks are made through the gRPC API; the API must show them as the Admin RPCs do,
map errors like the RPCs (status + field, never a traceback), guard actions (admin
token, JSON content type, same origin, Host check) and stream live events.
"""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import grpc
import pytest

from dtq_cli.render import to_dict
from dtq_proto import dtq_pb2
from tests.support.dashboard import XSS, dashboard_gateway

ADMIN, PRODUCER = "admin-token-1", "producer-token-1"
TOKENS = f"{ADMIN}=admin:alice,{PRODUCER}=producer:bob"


async def _json(session: aiohttp.ClientSession, method: str, url: str, **kw):
    async with session.request(method, url, **kw) as resp:
        return resp.status, await resp.json()


async def test_pages_and_reads_show_real_tasks(redis_url):
    async with dashboard_gateway(redis_url) as dg, aiohttp.ClientSession() as http:
        ok_id = await dg.succeed("mail", "send", {"to": "a@b"}, {"sent": True})
        dead_id = await dg.dead_letter("mail", "send", {"note": XSS}, "boom " + XSS)
        await dg.enqueue("mail", "send", {"n": 1}, priority=9)

        async with http.get(dg.url + "/") as resp:
            assert resp.status == 200
            assert "default-src 'none'" in resp.headers["Content-Security-Policy"]
            assert "/static/app.js" in await resp.text()
        for path in ("/static/app.js", "/static/app.css"):
            async with http.get(dg.url + path) as resp:
                assert resp.status == 200

        status, queues = await _json(http, "GET", dg.url + "/api/queues")
        assert status == 200
        (mail,) = queues["queues"]
        assert mail["name"] == "mail" and mail["depth"] == 1
        assert {b["band"]: b["depth"] for b in mail["bands"]}[9] == 1
        assert mail["rates"]["enqueued"] >= 0  # counted from the events channel

        status, q = await _json(http, "GET", dg.url + "/api/queues/mail")
        assert status == 200 and q["dead_letter_depth"] == 1 and not q["paused"]
        assert {t["task_id"] for t in q["recent"]} >= {ok_id, dead_id}

        status, task = await _json(http, "GET", dg.url + f"/api/tasks/{ok_id}")
        assert status == 200 and task["status"] == "SUCCEEDED"
        assert task["payload"] == {"encoding": "json", "value": {"to": "a@b"}, "bytes": 13}
        assert task["result"]["value"] == {"sent": True}

        status, task = await _json(http, "GET", dg.url + f"/api/tasks/{dead_id}")
        assert task["status"] == "DEAD_LETTERED" and task["last_error"] == "boom " + XSS
        assert task["attempts"][0]["error_class"] == "ValueError"

        status, dlq = await _json(http, "GET", dg.url + "/api/dead-letters?queue=mail")
        assert [d["task_id"] for d in dlq["entries"]] == [dead_id]
        assert dlq["entries"][0]["payload"]["value"] == {"note": XSS}
        status, dlq = await _json(http, "GET",
                                  dg.url + "/api/dead-letters?error_class=KeyError")
        assert status == 200 and dlq["entries"] == []

        status, workers = await _json(http, "GET", dg.url + "/api/workers")
        assert {w["worker_id"] for w in workers["workers"]} >= {"w-ok", "w-dlq"}


async def test_actions_requeue_discard_redrive_pause(redis_url):
    async with dashboard_gateway(redis_url) as dg, aiohttp.ClientSession() as http:
        ids = [await dg.dead_letter("jobs", "work", {"i": i}, f"err {i}") for i in range(3)]
        status, dry = await _json(http, "POST", dg.url + "/api/dead-letters/redrive",
                                  json={"queue": "jobs", "dry_run": True})
        assert status == 200 and dry["matched"] == 3 and dry["requeued"] == 0

        status, body = await _json(http, "POST", dg.url + f"/api/dead-letters/{ids[0]}/requeue",
                                   json={})
        assert status == 200 and body["task_id"] == ids[0]
        status, body = await _json(http, "POST", dg.url + f"/api/dead-letters/{ids[1]}/discard",
                                   json={})
        assert status == 200
        status, dlq = await _json(http, "GET", dg.url + "/api/dead-letters")
        assert [d["task_id"] for d in dlq["entries"]] == [ids[2]]
        (got,) = [await dg.broker.GetTask(dtq_pb2.GetTaskRequest(task_id=ids[0]))]
        assert got.task.status == dtq_pb2.TASK_STATUS_QUEUED

        status, body = await _json(http, "POST", dg.url + "/api/queues/jobs/pause",
                                   json={"reason": "maintenance"})
        assert status == 200 and body["changed"] is True
        stats = await dg.admin.GetQueueStats(dtq_pb2.GetQueueStatsRequest(queue="jobs"))
        assert stats.paused
        audit = await dg.admin.ListAudit(dtq_pb2.ListAuditRequest())
        actions = [(a.action, a.actor) for a in audit.entries]
        assert ("pause_queue", "dashboard") in actions
        assert ("requeue_dead_letter", "dashboard") in actions


@pytest.mark.parametrize(("method", "path", "body", "status", "field"), [
    ("GET", "/api/queues?page_size=abc", None, 400, "page_size"),
    ("GET", "/api/queues?page_size=100000", None, 400, "page_size"),
    ("GET", "/api/queues/bad%20name", None, 400, "queue"),
    ("GET", "/api/queues/nosuch", None, 404, ""),
    ("GET", "/api/tasks/not-an-id", None, 400, "task_id"),
    ("GET", "/api/tasks/" + "0" * 32, None, 404, "task_id"),
    ("GET", "/api/recent?status=nope", None, 400, "status"),
    ("GET", "/api/dead-letters?page_token=x", None, 400, "page_token"),
    ("GET", "/api/audit?page_size=-1", None, 400, "page_size"),
    ("GET", "/api/events?type=NOPE", None, 400, "type"),
    ("GET", "/api/events?queue=%3Cb%3E", None, 400, "queue"),
    ("POST", "/api/dead-letters/redrive", {"limit": "many"}, 400, "limit"),
    ("POST", "/api/dead-letters/redrive", {"dry_run": "yes"}, 400, "dry_run"),
    ("POST", "/api/dead-letters/redrive", {"min_age_ms": 5, "max_age_ms": 1}, 400,
     "max_age_ms"),
    ("POST", "/api/dead-letters/redrive", [1, 2], 400, "body"),
    ("POST", "/api/dead-letters/" + "0" * 32 + "/requeue", {}, 404, ""),
    ("POST", "/api/queues/q/pause", {"reason": 7}, 400, "reason"),
    ("GET", "/api/nothing", None, 404, ""),
])
async def test_bad_input_is_a_json_error_naming_the_field(redis_url, method, path, body,
                                                          status, field):
    async with dashboard_gateway(redis_url) as dg, aiohttp.ClientSession() as http:
        kw = {"json": body} if body is not None else {}
        got, reply = await _json(http, method, dg.url + path, **kw)
        assert got == status, reply
        assert reply["error"]["field"] == field
        assert "Traceback" not in json.dumps(reply)


async def test_malformed_bodies_and_cross_site_posts_are_refused(redis_url):
    async with dashboard_gateway(redis_url) as dg, aiohttp.ClientSession() as http:
        url = dg.url + "/api/dead-letters/redrive"
        status, reply = await _json(http, "POST", url, data=b"{not json",
                                    headers={"Content-Type": "application/json"})
        assert status == 400 and reply["error"]["field"] == "body"
        # a cross-site HTML form can only send form or text bodies
        status, reply = await _json(http, "POST", url, data=b"dry_run=true",
                                    headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert status == 400 and reply["error"]["field"] == "content_type"
        status, reply = await _json(http, "POST", url, json={"dry_run": True},
                                    headers={"Origin": "http://evil.example"})
        assert status == 403 and reply["error"]["reason"] == "BAD_ORIGIN"
        status, reply = await _json(http, "POST", url, json={"dry_run": True},
                                    headers={"Origin": "null"})  # sandboxed frame
        assert status == 403 and reply["error"]["reason"] == "BAD_ORIGIN"
        # DNS rebinding: a foreign name pointing at 127.0.0.1
        status, reply = await _json(http, "GET", dg.url + "/api/queues",
                                    headers={"Host": "evil.example"})
        assert status == 403 and reply["error"]["reason"] == "HOST_NOT_ALLOWED"
        status, reply = await _json(http, "POST", url, data=b"x" * (100 * 1024),
                                    headers={"Content-Type": "application/json"})
        assert status == 413 and reply["error"]["field"] == "body"


async def test_tokens_on_every_api_call_needs_an_admin_token(redis_url):
    async with dashboard_gateway(redis_url, auth_tokens=TOKENS) as dg, \
            aiohttp.ClientSession() as http:
        dead_id = await dg.dead_letter("jobs", "work", {}, "boom")
        status, info = await _json(http, "GET", dg.url + "/api/info")
        assert status == 200 and info["auth_required"] is True
        async with http.get(dg.url + "/") as resp:  # the page itself holds no data
            assert resp.status == 200
        for method, path in (("GET", "/api/queues"), ("GET", f"/api/tasks/{dead_id}"),
                             ("POST", f"/api/dead-letters/{dead_id}/discard")):
            status, reply = await _json(http, method, dg.url + path, json={})
            assert status == 401 and reply["error"]["code"] == "UNAUTHENTICATED"
            status, reply = await _json(http, method, dg.url + path, json={},
                                        headers={"Authorization": f"Bearer {PRODUCER}"})
            assert status == 403 and reply["error"]["code"] == "PERMISSION_DENIED"
        admin = {"Authorization": f"Bearer {ADMIN}"}
        status, _ = await _json(http, "POST", dg.url + f"/api/dead-letters/{dead_id}/discard",
                                json={}, headers=admin)
        assert status == 200
        audit = await dg.admin.ListAudit(dtq_pb2.ListAuditRequest())
        assert ("discard_dead_letter", "alice") in [(a.action, a.actor) for a in audit.entries]
        # with tokens, any Host is fine (a rebinding page has no token)
        status, _ = await _json(http, "GET", dg.url + "/api/queues",
                                headers={**admin, "Host": "dtq.internal"})
        assert status == 200


async def test_live_feed_streams_events_and_ends_on_stop(redis_url):
    async with dashboard_gateway(redis_url) as dg, aiohttp.ClientSession() as http:
        # pub/sub keeps no history: the hub listens before the first event is published
        await asyncio.wait_for(dg.gateway.ops.hub.connected.wait(), 5)
        async with http.get(dg.url + "/api/events?queue=feed") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            assert await resp.content.readline() == b": connected\n"
            await resp.content.readline()
            task_id = await dg.enqueue("other", "t", {})  # filtered out
            task_id = await dg.enqueue("feed", "t", {"x": 1})
            line = await asyncio.wait_for(resp.content.readline(), 5)
            event = json.loads(line[len(b"data: "):])
            assert event["type"] == "TASK_QUEUED" and event["task_id"] == task_id
            assert event["queue"] == "feed"
            assert dg.gateway.ops.hub.subscriber_count == 1
            await dg.gateway.dashboard.stop()  # the stream ends, the subscription goes
            rest = await asyncio.wait_for(resp.content.read(), 5)
            assert rest in (b"", b"\n")
        assert dg.gateway.ops.hub.subscriber_count == 0


async def test_feeds_count_against_the_subscriber_cap(redis_url):
    async with dashboard_gateway(redis_url, events_max_subscribers=1) as dg, \
            aiohttp.ClientSession() as http, http.get(dg.url + "/api/events") as first:
        assert first.status == 200
        status, reply = await _json(http, "GET", dg.url + "/api/events")
        assert status == 429 and reply["error"]["reason"] == "TOO_MANY_SUBSCRIBERS"
        await dg.gateway.dashboard.stop()


async def test_redis_down_is_503_like_the_rpcs(own_redis):
    async with dashboard_gateway(own_redis.url) as dg, aiohttp.ClientSession() as http:
        own_redis.kill()
        async with http.get(dg.url + "/api/queues") as resp:
            reply = await resp.json()
            assert resp.status == 503 and resp.headers["Retry-After"] == "1"
        assert reply["error"]["code"] == "UNAVAILABLE"
        assert reply["error"]["reason"] == "REDIS_UNAVAILABLE"


async def test_cancel_recent_and_audit(redis_url):
    async with dashboard_gateway(redis_url) as dg, aiohttp.ClientSession() as http:
        task_id = await dg.enqueue("cq", "t", {"n": 1})
        status, body = await _json(http, "POST", dg.url + f"/api/tasks/{task_id}/cancel",
                                   json={"reason": "not needed"},
                                   headers={"X-Request-Id": "req-42"})
        assert status == 200 and body["outcome"] == "cancelled"
        assert body["request_id"] == "req-42"
        status, body = await _json(http, "POST", dg.url + f"/api/tasks/{task_id}/cancel",
                                   json={})
        assert status == 409 and body["error"]["reason"] == "TASK_TERMINAL"

        # statuses are upper case, as in `dtq --json`; the filter takes either case
        for name in ("cancelled", "CANCELLED"):
            status, recent = await _json(http, "GET",
                                         dg.url + f"/api/recent?queue=cq&status={name}")
            assert status == 200 and [t["task_id"] for t in recent["tasks"]] == [task_id]
            assert recent["tasks"][0]["status"] == "CANCELLED"
        assert "payload" not in recent["tasks"][0]
        cli_doc = to_dict((await dg.broker.GetTask(dtq_pb2.GetTaskRequest(task_id=task_id))).task)
        assert cli_doc["status"] == recent["tasks"][0]["status"]  # what dtq --json prints

        status, audit = await _json(http, "GET", dg.url + "/api/audit?page_size=1")
        (entry,) = audit["entries"]
        assert (entry["action"], entry["actor"], entry["task_id"], entry["request_id"]) == (
            "cancel_task", "dashboard", task_id, "req-42")


async def test_task_progress_and_queue_outcomes_and_stuck_types(redis_url):
    """The task page carries the handler's progress; the queue page the outcome counts
    and the waiting task types, naming a type no live worker takes as stuck."""
    from tests.support.leasing import LeaseStream

    async with dashboard_gateway(redis_url) as dg, aiohttp.ClientSession() as http:
        await dg.succeed("jobs", "resize", {"n": 0}, {"ok": True})
        run_id = await dg.enqueue("jobs", "resize", {"n": 1})
        stream = await LeaseStream(dg.broker, "w-prog", ["jobs"],
                                   task_types=["resize"]).open()
        try:
            task = await stream.next()
            await dg.broker.Heartbeat(dtq_pb2.HeartbeatRequest(
                worker_id="w-prog", lease_ids=[task.lease_id],
                progress=[dtq_pb2.TaskProgress(lease_id=task.lease_id, percent=40,
                                               message="resizing " + XSS)]))
            await dg.enqueue("jobs", "nobody.takes.this", {})
            status, t = await _json(http, "GET", dg.url + f"/api/tasks/{run_id}")
            assert status == 200
            assert (t["progress_percent"], t["progress_message"]) == (40, "resizing " + XSS)
            assert t["progress_at_ms"] > 0 and t["chain_state"] == "UNSPECIFIED"
            status, q = await _json(http, "GET", dg.url + "/api/queues/jobs")
            assert status == 200 and (q["succeeded"], q["failed"]) == (1, 0)
            waiting = {w["task_type"]: w for w in q["waiting_types"]}
            assert waiting["nobody.takes.this"]["waiting"] == 1
            assert q["stuck_task_types"] == ["nobody.takes.this"]
        finally:
            stream.close()


async def test_deep_json_is_a_400_and_a_deep_payload_still_shows(redis_url):
    """A request body nested beyond the parser's stack is a 400 naming the body, and a
    payload nested as deep as Enqueue accepts is shown (as text when too deep to parse)."""
    async with dashboard_gateway(redis_url) as dg, aiohttp.ClientSession() as http:
        task_id = await dg.enqueue("deep", "t", {"n": 1})
        deep = '{"reason": ' + "[" * 5000 + "]" * 5000 + "}"
        async with http.post(dg.url + "/api/queues/deep/pause", data=deep,
                             headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["field"] == "body"
        status, task = await _json(http, "GET", dg.url + f"/api/tasks/{task_id}")
        assert status == 200
        for depth in range(990, 0, -10):  # the deepest payload Enqueue accepts here
            nested = "[" * depth + "]" * depth
            try:
                r = await dg.broker.Enqueue(dtq_pb2.EnqueueRequest(
                    queue="deep", task_type="t", payload=nested.encode(),
                    content_type="application/json"))
                break
            except grpc.aio.AioRpcError:
                continue
        status, task = await _json(http, "GET", dg.url + f"/api/tasks/{r.task_id}")
        assert status == 200 and task["payload"]["bytes"] == len(nested)


#: Requests aiohttp cannot parse: garbage, bad request lines, bad or oversized headers.
MALFORMED = [
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n",
    b"GET\r\n\r\n",
    b"GET / HTTP/9.9\r\nHost: localhost\r\n\r\n",
    b"GET /a\x00b HTTP/1.1\r\nHost: localhost\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: localhost\r\nno colon here\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: localhost\r\nBad Name: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
    b"POST /api/queues/q/pause HTTP/1.1\r\nHost: localhost\r\nContent-Length: abc\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    b"POST / HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
]


async def _send_raw(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 30)
    except ConnectionError:
        return b""
    finally:
        writer.close()


async def test_malformed_http_is_never_an_error_log(redis_url, caplog):
    """50 requests the HTTP parser refuses: each is answered (400 or a closed
    connection), counted, logged below ERROR without a traceback, and the dashboard
    still serves afterwards."""
    from prometheus_client import REGISTRY

    def counted() -> float:
        return REGISTRY.get_sample_value("dtq_dashboard_malformed_requests_total") or 0.0

    caplog.set_level(logging.DEBUG)
    async with dashboard_gateway(redis_url) as dg, aiohttp.ClientSession() as http:
        before = counted()
        answers = [await _send_raw(dg.gateway.dashboard.port, MALFORMED[i % len(MALFORMED)])
                   for i in range(50)]
        assert all(a == b"" or a.split(b" ", 2)[1] == b"400" for a in answers), answers
        async with http.get(dg.url + "/api/info") as resp:
            assert resp.status == 200
        refused = counted() - before
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [(r.name, r.levelname, r.getMessage()) for r in bad]
    assert "Traceback" not in caplog.text
    assert refused == 50


async def test_a_body_declared_too_large_is_refused_before_it_is_sent(redis_url):
    """Content-Length over the 64 KiB bound is answered 413 at once: the dashboard does
    not wait for (or read) a body it would refuse."""
    from urllib.parse import urlsplit

    async with dashboard_gateway(redis_url) as dg:
        where = urlsplit(dg.url)
        reader, writer = await asyncio.open_connection(where.hostname, where.port)
        try:
            writer.write(f"POST /api/dead-letters/redrive HTTP/1.1\r\nHost: {where.netloc}\r\n"
                         "Content-Type: application/json\r\nContent-Length: 100000000\r\n"
                         "\r\n{}".encode())
            await writer.drain()
            status_line = await asyncio.wait_for(reader.readline(), 10)
        finally:
            writer.close()
    assert status_line.split()[1] == b"413", status_line


async def test_queue_page_shows_its_concurrency_keys(redis_url):
    """The queue API carries the per-key limit and the busiest keys with their active and
    waiting (parked) tasks (docs/fairness.md)."""
    from tests.support.leasing import LeaseStream, poll

    async with dashboard_gateway(redis_url) as dg, aiohttp.ClientSession() as http:
        await dg.admin.SetConcurrencyLimit(dtq_pb2.SetConcurrencyLimitRequest(
            queue="ck", max_active_per_key=1))
        for key in ("tenant-1", "tenant-1", "tenant-2"):
            await dg.broker.Enqueue(dtq_pb2.EnqueueRequest(
                queue="ck", task_type="t", payload=b"{}", concurrency_key=key))
        stream = await LeaseStream(dg.broker, "w-ck", ["ck"], max_in_flight=5).open()
        try:
            await stream.take(2)

            async def conc():
                return (await _json(http, "GET", dg.url + "/api/queues/ck"))[1]["concurrency"]

            c = await poll(conc, lambda c: c["waiting"] == 1)
            assert (c["max_active_per_key"], c["key_count"], c["active"]) == (1, 2, 2)
            assert c["keys"] == [{"key": "tenant-1", "active": 1, "waiting": 1},
                                 {"key": "tenant-2", "active": 1, "waiting": 0}]
        finally:
            stream.close()
