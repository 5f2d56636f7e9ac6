"""The web dashboard in a real browser (headless Chromium driven by Playwright).

Tasks are made through the gRPC API; the test opens each page, checks what it shows,
requeues and discards dead letters and pauses a queue by clicking, checks the effect
through gRPC, proves that client-written markup stays text, and saves screenshots.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from playwright.async_api import Page, async_playwright, expect

from dtq_proto import dtq_pb2
from tests.support.dashboard import XSS, DashboardGateway, dashboard_gateway
from tests.support.leasing import LeaseStream

# the first test may install chromium with apt-get (once per machine): minutes, not seconds
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ADMIN = "dashboard-admin-token"


async def _no_xss(page: Page) -> None:
    assert await page.evaluate("() => window.__xss") is None


async def _heartbeats(dg: DashboardGateway, worker_id: str) -> None:
    """Heartbeat as ``worker_id`` with no Lease stream, until cancelled."""
    while True:
        await dg.broker.Heartbeat(dtq_pb2.HeartbeatRequest(worker_id=worker_id,
                                                           hostname="quiet"))
        await asyncio.sleep(0.2)


async def _seed(dg: DashboardGateway) -> dict[str, str]:
    ids = {"ok": await dg.succeed("emails", "send", {"to": "ann@example.com", "html": XSS},
                                  {"delivered": True, "note": XSS})}
    for i in range(2):
        ids[f"dead{i}"] = await dg.dead_letter("emails", "send", {"to": f"bad{i}@x"},
                                               f"SMTP 550 {XSS}", error_class="SmtpError")
    for i in range(3):
        await dg.enqueue("reports", "build", {"n": i}, priority=9 if i == 0 else 2)
    return ids


async def test_dashboard_pages_and_actions(redis_url, chromium: str, screenshots: Path):
    async with dashboard_gateway(redis_url) as dg, async_playwright() as pw:
        ids = await _seed(dg)
        idle = await LeaseStream(dg.broker, "w-live", ["idle-q"],
                                 labels={"zone": "<b>eu</b>", "gpu": "no"}).open()
        quiet_beats = asyncio.create_task(_heartbeats(dg, "w-quiet"))
        browser = await pw.chromium.launch(executable_path=chromium)
        try:
            page = await browser.new_page(viewport={"width": 1360, "height": 820})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))

            # queues: depth per band, backlog age, rates
            await page.goto(dg.url + "/#/queues")
            reports = page.locator('tr[data-queue="reports"]')
            await expect(reports).to_be_visible()
            await expect(reports.locator("td").nth(2)).to_have_text("3")
            await expect(reports.locator('td[title^="p9:"]')).to_have_text("1")
            await expect(reports.locator('td[title^="p2:"]')).to_have_text("2")
            await expect(page.locator('tr[data-queue="emails"]')).to_be_visible()
            await page.screenshot(path=screenshots / "dashboard-queues.png", full_page=True)

            # task: decoded payload and result, attempt history; markup stays text
            await page.goto(dg.url + f"/#/tasks/{ids['ok']}")
            await expect(page.locator("h1 .badge")).to_have_text("succeeded")
            payload = page.locator("pre.payload").first
            await expect(payload).to_contain_text('"to": "ann@example.com"')
            await expect(payload).to_contain_text(json.dumps(XSS))  # JSON-escaped, as text
            await expect(page.locator("pre.payload").nth(1)).to_contain_text('"delivered": true')
            await expect(page.locator("table.attempts tbody tr")).to_have_count(1)
            assert "null" not in await page.locator("main").inner_text()
            await page.screenshot(path=screenshots / "dashboard-task.png", full_page=True)
            await page.goto(dg.url + f"/#/tasks/{ids['dead0']}")
            await expect(page.locator("pre.error")).to_have_text(f"SmtpError: SMTP 550 {XSS}")
            await _no_xss(page)

            # dead letters: filter, dry-run redrive, requeue one, discard the other
            await page.goto(dg.url + "/#/dead-letters?queue=emails")
            rows = page.locator("table.dead-letters tbody tr[data-task]")
            await expect(rows).to_have_count(2)
            assert "null" not in await page.locator("main").inner_text()
            await expect(rows.first).to_contain_text(f"SMTP 550 {XSS}")
            await page.get_by_role("button", name="Dry run").click()
            await expect(page.locator("#redrive-outcome")).to_have_text(
                "2 dead letter(s) match queue=emails")
            await page.screenshot(path=screenshots / "dashboard-dead-letters.png",
                                  full_page=True)
            await page.locator(f'tr[data-task="{ids["dead0"]}"] button.requeue').click()
            await expect(page.locator("#flash")).to_contain_text("requeued")
            await expect(rows).to_have_count(1)
            discard = page.locator(f'tr[data-task="{ids["dead1"]}"] button.discard')
            await discard.click()
            await expect(discard).to_have_text("Confirm discard")
            await discard.click()
            await expect(rows).to_have_count(0)
            requeued = await dg.broker.GetTask(dtq_pb2.GetTaskRequest(task_id=ids["dead0"]))
            assert requeued.task.status == dtq_pb2.TASK_STATUS_QUEUED
            discarded = await dg.broker.GetTask(dtq_pb2.GetTaskRequest(task_id=ids["dead1"]))
            assert discarded.task.metadata["discarded"] == "true"

            # workers: state, queues, labels (as text), in-flight
            await page.goto(dg.url + "/#/workers")
            live = page.locator('tr[data-worker="w-live"]')
            await expect(live.locator("td").nth(3)).to_have_text("idle-q")
            await expect(live.locator(".label-chip").first).to_have_text("gpu=no")
            await expect(live.locator(".label-chip").nth(1)).to_have_text("zone=<b>eu</b>")
            await expect(live.locator(".badge")).to_have_text("alive")
            await expect(live.locator("td").nth(2)).to_have_text("alive leasing")
            # heartbeats but no Lease stream (never opened, or ended as not reading)
            quiet = page.locator('tr[data-worker="w-quiet"]')
            await expect(quiet.locator("td").nth(2)).to_have_text(
                "alive connected, not leasing")
            await page.screenshot(path=screenshots / "dashboard-workers.png", full_page=True)

            # live events: a task enqueued now shows up
            await page.goto(dg.url + "/#/events")
            await expect(page.locator("#feed-state .badge")).to_have_text("live")
            fresh = await dg.enqueue("emails", "send", {"to": "late@example.com"})
            row = page.locator('table.event-list tr[data-type="TASK_QUEUED"]')
            await expect(row.first).to_contain_text(fresh[:12])
            await page.screenshot(path=screenshots / "dashboard-events.png", full_page=True)

            # pause a queue from its page
            await page.goto(dg.url + "/#/queues/reports")
            pause = page.locator("#pause-toggle")
            await pause.click()
            await pause.click()
            await expect(page.locator("h1 .badge")).to_have_text("paused")
            stats = await dg.admin.GetQueueStats(dtq_pb2.GetQueueStatsRequest(queue="reports"))
            assert stats.paused
            await page.screenshot(path=screenshots / "dashboard-queue.png", full_page=True)

            await _no_xss(page)
            assert errors == []
        finally:
            quiet_beats.cancel()
            idle.close()
            await browser.close()


async def test_task_progress_and_dead_letters_at_1400px(redis_url, chromium: str,
                                                       screenshots: Path):
    """Paper cuts: the progress line is text, not "[object HTMLSpanElement]"; the
    dead-letter list fits 1400 px; dry run and redrive use the applied filter; redrive
    asks with the count before it requeues."""
    async with dashboard_gateway(redis_url) as dg, async_playwright() as pw:
        first = await dg.enqueue("media", "resize", {"n": 1}, chain=[
            dtq_pb2.EnqueueRequest(queue="media", task_type="notify")])
        stream = await LeaseStream(dg.broker, "w-prog", ["media"]).open()
        long_error = "SMTP 550 mailbox unavailable " * 12
        dead = [await dg.dead_letter("emails", "send", {"to": f"bad{i}@x", "body": "x" * 300},
                                     long_error, error_class="SmtpError") for i in range(2)]
        await dg.dead_letter("other", "send", {"to": "o@x"}, "boom")
        browser = await pw.chromium.launch(executable_path=chromium)
        try:
            leased = await stream.next()
            await dg.broker.Heartbeat(dtq_pb2.HeartbeatRequest(
                worker_id="w-prog", lease_ids=[leased.lease_id], progress=[
                    dtq_pb2.TaskProgress(lease_id=leased.lease_id, percent=18,
                                         message="step 11")]))
            page = await browser.new_page(viewport={"width": 1400, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))

            await page.goto(dg.url + f"/#/tasks/{first}")
            progress = page.locator("#task-progress")
            await expect(progress).to_have_text(
                re.compile(r"^18% step 11 \(20\d\d-\d\d-\d\d \d\d:\d\d:\d\d \(.* ago\)\)$"))
            assert "[object" not in await page.locator("main").inner_text()

            # a task cancelled before it ever ran shows no attempt; the API's status
            # is upper case (as in dtq --json), the page shows it in words
            never = await dg.enqueue("idle-q", "t", {})
            await dg.broker.CancelTask(dtq_pb2.CancelTaskRequest(task_id=never))
            await page.goto(dg.url + f"/#/tasks/{never}")
            await expect(page.locator("h1 .badge")).to_have_text("cancelled")
            await expect(page.locator("dl.kv")).to_contain_text("none of 3 (never ran)")

            await page.goto(dg.url + "/#/dead-letters?queue=emails")
            rows = page.locator("table.dead-letters tbody tr[data-task]")
            await expect(rows).to_have_count(2)
            failed = rows.first.locator("td.failed-at")
            line = await failed.evaluate("td => parseFloat(getComputedStyle(td).lineHeight)")
            box = await failed.bounding_box()
            assert box["height"] < 2 * line + 12, box  # one line (plus the cell's padding)
            for i in range(2):
                discard = rows.nth(i).locator("button.discard")
                btn = await discard.bounding_box()
                assert btn["x"] + btn["width"] <= 1400, btn
            await page.screenshot(path=screenshots / "dashboard-dead-letters-1400.png")

            # typed but not applied: the dry run still counts the filter the list shows
            await page.locator('#dlq-filter input[name="queue"]').fill("other")
            await page.get_by_role("button", name="Dry run").click()
            await expect(page.locator("#redrive-outcome")).to_have_text(
                "2 dead letter(s) match queue=emails")
            go = page.locator("#redrive-go")
            await go.click()
            await expect(go).to_have_text("Confirm redrive of 2")
            for task_id in dead:  # nothing requeued by the first click
                got = await dg.broker.GetTask(dtq_pb2.GetTaskRequest(task_id=task_id))
                assert got.task.status == dtq_pb2.TASK_STATUS_DEAD_LETTERED
            await go.click()
            await expect(page.locator("#flash")).to_have_text("redrive: 2 of 2 requeued")
            for task_id in dead:
                got = await dg.broker.GetTask(dtq_pb2.GetTaskRequest(task_id=task_id))
                assert got.task.status == dtq_pb2.TASK_STATUS_QUEUED
            other = await dg.admin.ListDeadLetters(dtq_pb2.ListDeadLettersRequest(queue="other"))
            assert len(other.entries) == 1
            assert errors == []
        finally:
            stream.close()
            await browser.close()


async def test_dashboard_login_with_admin_token(redis_url, chromium: str):
    tokens = f"{ADMIN}=admin:alice,producer-token-9=producer:bob"
    async with dashboard_gateway(redis_url, auth_tokens=tokens) as dg, \
            async_playwright() as pw:
        await dg.enqueue("secure", "t", {"x": 1})
        browser = await pw.chromium.launch(executable_path=chromium)
        try:
            page = await browser.new_page()
            await page.goto(dg.url + "/#/queues")
            await expect(page.locator("#login")).to_be_visible()
            await page.fill("#token", "producer-token-9")
            await page.press("#token", "Enter")
            await expect(page.locator("#error")).to_contain_text("admin only")
            await page.evaluate("() => sessionStorage.clear()")
            await page.reload()
            await page.fill("#token", ADMIN)
            await page.press("#token", "Enter")
            await expect(page.locator('tr[data-queue="secure"]')).to_be_visible()
            assert re.fullmatch(ADMIN, await page.evaluate(
                "() => sessionStorage.getItem('dtq.token')"))
            assert await page.context.cookies() == []
            await page.goto(dg.url + "/#/events")  # the feed sends the token too
            await expect(page.locator("#feed-state .badge")).to_have_text("live")
        finally:
            await browser.close()
