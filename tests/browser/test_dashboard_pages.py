"""The dashboard's history charts, schedules and rate limits pages, and a task's chain
and group, in headless Chromium (Debian's ``chromium``, driven by Playwright).

Each test runs a real load through gRPC, clicks through the page, checks the effect
through gRPC (and the audit stream), and saves the screenshots that docs/dashboard.md
shows into docs/img.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, async_playwright, expect

from dtq_proto import dtq_pb2
from tests.support.dashboard import DashboardGateway, dashboard_gateway
from tests.support.leasing import LeaseStream

# the first browser test may install chromium with apt-get (once per machine)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

DOC_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "img"


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


async def _history_until(dg: DashboardGateway, queue: str, pred: Any,
                         deadline_s: float = 60.0) -> dict[str, Any]:
    """Poll /api/history?queue= until ``pred(totals)`` holds (totals: sums per field)."""
    deadline = time.monotonic() + deadline_s
    while True:
        data = await asyncio.to_thread(_get_json, f"{dg.url}/api/history?queue={queue}")
        totals = {k: sum(p[k] for p in data["points"])
                  for k in ("enqueued", "succeeded", "failed", "dead_lettered")}
        if pred(totals):
            return data
        assert time.monotonic() < deadline, (totals, data["points"][-3:])
        await asyncio.sleep(0.2)


async def _chart_sums(page: Page, chart_id: str) -> dict[str, float]:
    return json.loads(await page.locator(f"#{chart_id}").get_attribute("data-sums"))


async def test_history_charts_show_the_load_just_run(redis_url, chromium: str):
    async with dashboard_gateway(redis_url, history_interval_s=1) as dg, \
            async_playwright() as pw:
        # the load, in three rounds a sample or more apart: 12 tasks enqueued, 8 succeed,
        # 2 are dead-lettered, 2 still wait
        redis = dg.gateway.redis
        for acks, fails, waits in ((4, 0, 0), (3, 1, 0), (1, 1, 2)):
            for i in range(acks + fails):
                await dg.enqueue("hist", "resize", {"n": i})
            stream = await LeaseStream(dg.broker, "w-hist", ["hist"],
                                       max_in_flight=acks + fails).open()
            leased = await stream.take(acks + fails)
            await dg.broker.Ack(dtq_pb2.AckRequest(items=[
                dtq_pb2.AckItem(lease_id=t.lease_id, result=b"{}") for t in leased[:acks]]))
            if fails:
                await dg.broker.Fail(dtq_pb2.FailRequest(items=[dtq_pb2.FailItem(
                    lease_id=t.lease_id, error_message="boom", retryable=False)
                    for t in leased[acks:]]))
            stream.close()
            # the waiting tasks come once the session is gone: one leased to the closing
            # stream would come back through the reaper as a lost lease (failed, retried)
            deadline = time.monotonic() + 10
            while dg.gateway.dispatcher.sessions:
                assert time.monotonic() < deadline, "the closed Lease session stays open"
                await asyncio.sleep(0.05)
            for i in range(waits):
                await dg.enqueue("hist", "resize", {"n": i})
            newest = await redis.lindex("dtq:history", 0)
            deadline = time.monotonic() + 30
            while await redis.lindex("dtq:history", 0) == newest:  # a new sample
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
        await _history_until(dg, "hist", lambda t: t["enqueued"] >= 12
                             and t["succeeded"] >= 8 and t["dead_lettered"] >= 2)
        browser = await pw.chromium.launch(executable_path=chromium)
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            # a CSP violation is a console error; a missing file a failed response
            page.on("console", lambda m: errors.append(m.text) if m.type == "error"
                    and not m.text.startswith("Failed to load resource") else None)
            page.on("response", lambda r: errors.append(f"{r.status} {r.url}")
                    if r.status >= 400 and not r.url.endswith("/favicon.ico") else None)
            await page.goto(dg.url + "/#/history?queue=hist")
            await expect(page.locator("#chart-outcomes canvas")).to_have_count(1)
            for chart in ("chart-backlog", "chart-wait", "chart-run"):
                await expect(page.locator(f"#{chart} canvas")).to_have_count(1)
            sums = await _chart_sums(page, "chart-outcomes")
            assert (sums["enqueued"], sums["succeeded"], sums["failed"],
                    sums["dead_lettered"]) == (12, 8, 2, 2)
            backlog = await _chart_sums(page, "chart-backlog")
            assert backlog["depth"] > 0  # the two waiting tasks, sample after sample
            run = await _chart_sums(page, "chart-run")
            assert run["run_p99"] >= run["run_p50"] >= 0
            await expect(page.locator('nav a[data-nav="history"]')).to_have_class("active")
            await page.screenshot(path=DOC_IMAGES / "dashboard-history.png", full_page=True)

            # all queues together: the same load, from the same Redis lists
            await page.goto(dg.url + "/#/history")
            await expect(page.locator("#chart-outcomes canvas")).to_have_count(1)
            overall = await _chart_sums(page, "chart-outcomes")
            assert overall["enqueued"] >= 12 and overall["succeeded"] >= 8
            assert errors == []
        finally:
            await browser.close()


async def test_schedules_page_pause_resume_trigger_delete(redis_url, chromium: str):
    async with dashboard_gateway(redis_url) as dg, async_playwright() as pw:
        for name, every_ms in (("nightly-report", 86_400_000), ("every-minute", 60_000)):
            await dg.admin.CreateSchedule(dtq_pb2.CreateScheduleRequest(
                schedule=dtq_pb2.Schedule(name=name, interval_ms=every_ms,
                                          task=dtq_pb2.EnqueueRequest(
                                              queue="reports", task_type="build"))))
        browser = await pw.chromium.launch(executable_path=chromium)
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 800})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(dg.url + "/#/schedules")
            row = page.locator('tr[data-schedule="nightly-report"]')
            await expect(row).to_be_visible()
            await expect(page.locator("h1")).to_have_text("Schedules")
            await expect(row.locator("td.next-fire")).to_have_text("in 24.0 h")
            await expect(row.locator(".badge")).to_have_text("live")

            pause = row.locator("button.pause")
            await pause.click()
            await expect(pause).to_have_text("Confirm pause")
            got = await dg.admin.GetSchedule(dtq_pb2.GetScheduleRequest(name="nightly-report"))
            assert not got.schedule.schedule.paused  # the first click only arms it
            await pause.click()
            await expect(row.locator(".badge")).to_have_text("paused")
            got = await dg.admin.GetSchedule(dtq_pb2.GetScheduleRequest(name="nightly-report"))
            assert got.schedule.schedule.paused
            await row.locator("button.resume").click()
            await expect(row.locator(".badge")).to_have_text("live")

            trigger = row.locator("button.trigger")
            await trigger.click()
            await trigger.click()
            await expect(page.locator("#flash")).to_contain_text("nightly-report: trigger")
            got = await dg.admin.GetSchedule(dtq_pb2.GetScheduleRequest(name="nightly-report"))
            task_id = got.schedule.last_task_id
            assert task_id
            await expect(row.locator("td").nth(7)).to_have_text(task_id[:12] + "…")
            await expect(row.locator("td.last-fire")).to_have_text("—")  # the timetable's
            await page.screenshot(path=DOC_IMAGES / "dashboard-schedules.png", full_page=True)

            delete = page.locator('tr[data-schedule="every-minute"] button.delete')
            await delete.click()
            await delete.click()
            await expect(page.locator('tr[data-schedule="every-minute"]')).to_have_count(0)
            listed = await dg.admin.ListSchedules(dtq_pb2.ListSchedulesRequest())
            assert [s.schedule.name for s in listed.schedules] == ["nightly-report"]

            audit = await dg.admin.ListAudit(dtq_pb2.ListAuditRequest(page_size=20))
            actions = [(a.action, a.actor, a.task_id) for a in audit.entries]
            for action, target in (("pause_schedule", "nightly-report"),
                                   ("resume_schedule", "nightly-report"),
                                   ("trigger_schedule", "nightly-report"),
                                   ("delete_schedule", "every-minute")):
                assert (action, "dashboard", target) in actions, actions
            assert errors == []
        finally:
            await browser.close()


async def test_rate_limits_page_lists_sets_and_deletes(redis_url, chromium: str):
    async with dashboard_gateway(redis_url) as dg, async_playwright() as pw:
        await dg.admin.SetRateLimit(dtq_pb2.SetRateLimitRequest(rate_limit=dtq_pb2.RateLimit(
            queue="emails", limit=50, period_ms=1000)))
        browser = await pw.chromium.launch(executable_path=chromium)
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 800})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(dg.url + "/#/rate-limits")
            existing = page.locator('tr[data-limit="emails *"]')
            await expect(existing.locator("td").nth(2)).to_have_text("50")

            form = page.locator("#rate-limit-form")
            await form.locator('input[name="queue"]').fill("emails")
            await form.locator('input[name="task_type"]').fill("send")
            await form.locator('input[name="limit"]').fill("5")
            await form.locator('input[name="period_ms"]').fill("60000")
            await form.get_by_role("button", name="Set limit").click()
            added = page.locator('tr[data-limit="emails send"]')
            await expect(added.locator("td").nth(2)).to_have_text("5")
            await expect(added.locator("td").nth(3)).to_have_text("1.0 min")
            listed = await dg.admin.ListRateLimits(dtq_pb2.ListRateLimitsRequest())
            assert [(r.queue, r.task_type, r.limit, r.period_ms, r.burst)
                    for r in listed.rate_limits] == [("emails", "", 50, 1000, 50),
                                                     ("emails", "send", 5, 60000, 5)]

            # bad input: the error names the field and nothing changes
            await form.locator('input[name="queue"]').fill("bad queue!")
            await form.get_by_role("button", name="Set limit").click()
            await expect(page.locator("#flash")).to_contain_text("rate_limit.queue")
            await page.screenshot(path=DOC_IMAGES / "dashboard-rate-limits.png",
                                  full_page=True)

            delete = existing.locator("button.delete")
            await delete.click()
            await expect(delete).to_have_text("Confirm delete")
            await delete.click()
            await expect(existing).to_have_count(0)
            listed = await dg.admin.ListRateLimits(dtq_pb2.ListRateLimitsRequest())
            assert [(r.queue, r.task_type) for r in listed.rate_limits] == [("emails", "send")]
            audit = await dg.admin.ListAudit(dtq_pb2.ListAuditRequest(page_size=10))
            actions = [(a.action, a.task_id, a.detail) for a in audit.entries]
            assert ("delete_rate_limit", "emails", "task_type=*") in actions
            assert ("set_rate_limit", "emails",
                    "task_type=send limit=5 period_ms=60000 burst=5") in actions
            assert errors == []
        finally:
            await browser.close()


async def test_task_page_shows_its_chain_and_its_group(redis_url, chromium: str):
    async with dashboard_gateway(redis_url) as dg, async_playwright() as pw:
        first = await dg.enqueue("media", "download", {"n": 1}, chain=[
            dtq_pb2.EnqueueRequest(queue="media", task_type="resize"),
            dtq_pb2.EnqueueRequest(queue="media", task_type="notify")])
        batch = await dg.broker.EnqueueBatch(dtq_pb2.EnqueueBatchRequest(
            items=[dtq_pb2.EnqueueRequest(queue="thumbs", task_type=f"thumb{i}",
                                          payload=b"{}") for i in range(3)],
            group_callback=dtq_pb2.EnqueueRequest(queue="done-q", task_type="summary")))
        members = [r.task_id for r in batch.results]
        stream = await LeaseStream(dg.broker, "w-chain", ["media", "thumbs"]).open()
        by_type = {t.task_type: t for t in await stream.take(4)}
        await dg.broker.Ack(dtq_pb2.AckRequest(items=[
            dtq_pb2.AckItem(lease_id=by_type[k].lease_id, result=b"{}")
            for k in ("download", "thumb0")]))
        await dg.broker.Fail(dtq_pb2.FailRequest(items=[dtq_pb2.FailItem(
            lease_id=by_type["thumb1"].lease_id, error_message="bad", retryable=False)]))
        second = ""
        deadline = time.monotonic() + 30
        while not second:  # the next step is created by the acking gateway
            got = await dg.broker.GetTask(dtq_pb2.GetTaskRequest(task_id=first))
            second = got.task.next_task_id
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        browser = await pw.chromium.launch(executable_path=chromium)
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(dg.url + f"/#/tasks/{second}")
            steps = page.locator("table.chain tbody tr")
            await expect(steps).to_have_count(3)
            await expect(steps.nth(0)).to_contain_text("download")
            await expect(steps.nth(0).locator(".badge")).to_have_text("succeeded")
            await expect(steps.nth(0).locator("a")).to_have_attribute("href", f"#/tasks/{first}")
            await expect(steps.nth(1)).to_contain_text("(this task)")
            # the open stream may already hold it
            await expect(steps.nth(1).locator(".badge")).to_have_text(re.compile("queued|active"))
            await expect(steps.nth(2)).to_contain_text("not created yet")
            await expect(steps.nth(2)).to_contain_text("notify")
            await expect(steps.nth(2).locator(".badge")).to_have_text("not_created")
            assert "null" not in await page.locator("main").inner_text()

            await page.goto(dg.url + f"/#/tasks/{first}")  # the first step shows it too
            await expect(steps).to_have_count(3)
            await expect(steps.nth(0)).to_contain_text("(this task)")
            await expect(steps.nth(1).locator("a")).to_have_attribute("href", f"#/tasks/{second}")

            await page.goto(dg.url + f"/#/tasks/{members[0]}")
            rows = page.locator("table.group tbody tr")
            await expect(rows).to_have_count(3)
            states = [await rows.nth(i).locator(".badge").inner_text() for i in range(3)]
            # the third is leased to a stream that sends no heartbeats: by now it may
            # be back in its queue (stream health or its visibility timeout)
            assert states[:2] == ["succeeded", "dead_lettered"]
            assert states[2] in ("active", "queued"), states
            summary = page.locator("#group-summary")
            await expect(summary).to_contain_text("open · 2 of 3 members finished")
            await expect(summary).to_contain_text("callback summary on done-q")
            await expect(rows.nth(1).locator("a")).to_have_attribute(
                "href", f"#/tasks/{members[1]}")
            assert "null" not in await page.locator("main").inner_text()
            await page.screenshot(path=DOC_IMAGES / "dashboard-task-group.png",
                                  full_page=True)
            assert errors == []
        finally:
            stream.close()
            await browser.close()
