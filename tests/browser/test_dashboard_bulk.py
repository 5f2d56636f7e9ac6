"""The dashboard's Search and Bulk actions pages in a real browser (headless Chromium
driven by Playwright): a search that finds a task by metadata, a bulk cancel by filter
and a purge, each checked through gRPC and in the Audit page."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import async_playwright, expect

from dtq_proto import dtq_pb2
from tests.support.dashboard import XSS, dashboard_gateway

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


async def _status(dg, task_id: str) -> int:
    return (await dg.broker.GetTask(dtq_pb2.GetTaskRequest(task_id=task_id))).task.status


async def test_search_bulk_cancel_and_purge(redis_url, chromium: str, screenshots: Path):
    async with dashboard_gateway(redis_url) as dg, async_playwright() as pw:
        for i in range(5):
            await dg.enqueue("orders", "charge", {"n": i}, metadata={"customer": f"c{i}"})
        wanted = await dg.enqueue("orders", "charge", {"n": 99},
                                  metadata={"customer": "c42", "note": XSS})
        eu = [await dg.enqueue("mail", "send", {"n": i}, metadata={"region": "eu"})
              for i in range(3)]
        us = await dg.enqueue("mail", "send", {"n": 9}, metadata={"region": "us"})
        waiting = [await dg.enqueue("reports", "build", {"n": i}) for i in range(4)]
        browser = await pw.chromium.launch(executable_path=chromium)
        try:
            page = await browser.new_page(viewport={"width": 1360, "height": 820})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))

            # the header's search box finds a task by metadata
            await page.goto(dg.url + "/#/queues")
            await page.locator("#search-box-text").fill("customer=c42")
            await page.locator("#search-box-text").press("Enter")
            rows = page.locator("table.search-results tbody tr[data-task]")
            await expect(rows).to_have_count(1)
            await expect(rows.first).to_have_attribute("data-task", wanted)
            await expect(rows.first).to_contain_text("customer=c42")
            await expect(page.locator("#search-cost")).to_contain_text("entries")
            await page.screenshot(path=screenshots / "dashboard-search.png", full_page=True)
            assert await page.evaluate("() => window.__xss") is None

            # bulk cancel by filter, from the queue's page: count, then cancel on the
            # confirming click
            await page.goto(dg.url + "/#/queues/mail")
            await page.get_by_role("link", name="Bulk actions on mail").click()
            await expect(page.locator("#bulk-queue")).to_have_value("mail")
            await page.locator("#bulk-meta").fill("region=eu")
            await page.locator("#bulk-count").click()
            await expect(page.locator("#bulk-outcome")).to_have_text(
                "3 waiting task(s) match")
            cancel = page.locator("#bulk-cancel")
            await cancel.click()
            await expect(cancel).to_have_text("Confirm cancel matching")
            await cancel.click()
            await expect(page.locator("#bulk-outcome")).to_contain_text(
                "cancelled 3 of 3 matching task(s)")
            for tid in eu:
                assert await _status(dg, tid) == dtq_pb2.TASK_STATUS_CANCELLED
            assert await _status(dg, us) == dtq_pb2.TASK_STATUS_QUEUED
            await page.screenshot(path=screenshots / "dashboard-bulk.png", full_page=True)

            # purge another queue from the same page
            await page.locator("#bulk-queue").fill("reports")
            await page.locator("#bulk-meta").fill("")
            purge = page.locator("#bulk-purge")
            await purge.click()
            await purge.click()
            await expect(page.locator("#bulk-outcome")).to_contain_text(
                "purged reports: cancelled 4 waiting task(s)")
            for tid in waiting:
                assert await _status(dg, tid) == dtq_pb2.TASK_STATUS_CANCELLED

            # both are audited
            await page.goto(dg.url + "/#/audit")
            audit = page.locator("main table tbody tr")
            await expect(audit.first).to_contain_text("purge_queue")
            await expect(audit.first).to_contain_text("reports")
            await expect(audit.nth(1)).to_contain_text("cancel_tasks")
            await expect(audit.nth(1)).to_contain_text('"region":"eu"')
            await page.screenshot(path=screenshots / "dashboard-bulk-audit.png",
                                  full_page=True)
            assert errors == []
        finally:
            await browser.close()
