"""Handler failures: Retry, PermanentError, non_retryable, other exceptions, timeouts."""

from __future__ import annotations

import asyncio
import threading

from dtq_proto import dtq_pb2
from dtq_pyworker import PermanentError, Retry
from tests.worker.helpers import make_worker, running


class Unfixable(Exception):
    non_retryable = True


async def test_exceptions_map_to_fail_items(fake):
    worker = make_worker(fake)

    @worker.task("retry")
    async def retry(payload, ctx):
        raise Retry(after_s=2.5)

    @worker.task("permanent")
    def permanent(payload, ctx):
        raise PermanentError("corrupt input")

    @worker.task("flag")
    async def flag(payload, ctx):
        raise Unfixable("nope")

    @worker.task("value")
    def value(payload, ctx):
        raise ValueError("bad value")

    async with running(worker):
        leases = {t: await fake.push(t) for t in ("retry", "permanent", "flag", "value")}
        await fake.wait_for(lambda: set(leases.values()) <= set(fake.failed()))
    failed = fake.failed()
    r = failed[leases["retry"]]
    assert (r.retryable, r.retry_after_ms, r.error_class) == (True, 2500, "Retry")
    p = failed[leases["permanent"]]
    assert (p.retryable, p.error_class, p.error_message) == (False, "PermanentError",
                                                             "corrupt input")
    assert failed[leases["flag"]].retryable is False
    v = failed[leases["value"]]
    assert (v.retryable, v.error_class, v.error_message) == (True, "ValueError", "bad value")
    assert all(i.mode == dtq_pb2.FAIL_MODE_FAILURE for i in failed.values())
    assert worker.stats["failed"] == 4
    assert worker.stats["retried"] == 2  # the fake schedules retryable failures
    assert worker.stats["processed"] == 0


async def test_async_handler_timeout_is_retryable_timeout(fake):
    worker = make_worker(fake)
    cancelled = asyncio.Event()

    @worker.task("slow")
    async def slow(payload, ctx):
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with running(worker):
        lease = await fake.push("slow", timeout_ms=100)
        await fake.wait_for(lambda: lease in fake.failed())
    item = fake.failed()[lease]
    assert (item.error_class, item.retryable) == ("Timeout", True)
    assert "timeout_ms=100" in item.error_message
    assert cancelled.is_set()
    assert worker.stats["timeouts"] == 1


async def test_sync_handler_timeout_sets_ctx_cancelled(fake):
    worker = make_worker(fake)
    stopped = threading.Event()

    @worker.task("slow")
    def slow(payload, ctx):
        if ctx.cancelled.wait(10):
            stopped.set()

    async with running(worker):
        lease = await fake.push("slow", timeout_ms=100)
        await fake.wait_for(lambda: lease in fake.failed())
        await asyncio.to_thread(stopped.wait, 5)
    assert fake.failed()[lease].error_class == "Timeout"
    assert stopped.is_set()


async def test_handler_raising_timeout_error_itself_is_not_a_timeout(fake):
    worker = make_worker(fake)

    @worker.task("t")
    async def t(payload, ctx):
        raise TimeoutError("upstream timed out")

    async with running(worker):
        lease = await fake.push("t", timeout_ms=10_000)
        await fake.wait_for(lambda: lease in fake.failed())
    assert fake.failed()[lease].error_class == "TimeoutError"


async def test_unknown_task_type_fails_permanently(fake):
    worker = make_worker(fake, task_types=["known", "other"])
    worker.register("known", lambda p, c: None)
    async with running(worker):
        lease = await fake.push("other")
        await fake.wait_for(lambda: lease in fake.failed())
    item = fake.failed()[lease]
    assert (item.error_class, item.retryable) == ("UnknownTaskType", False)
    assert list(fake.lease_requests[0].task_types) == ["known", "other"]


async def test_unserialisable_result_is_permanent(fake):
    worker = make_worker(fake)
    worker.register("t", lambda p, c: object())
    async with running(worker):
        lease = await fake.push("t")
        await fake.wait_for(lambda: lease in fake.failed())
    item = fake.failed()[lease]
    assert (item.error_class, item.retryable) == ("ResultEncodeError", False)
