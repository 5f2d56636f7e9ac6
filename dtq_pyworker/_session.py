"""The Lease stream consumer (with reconnect) and the heartbeat loop of a Worker."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

import grpc

from dtq_proto import dtq_pb2
from dtq_pyworker._backoff import Backoff
from dtq_pyworker._channel import RECONNECT_INITIAL_S
from dtq_pyworker._runtime import STOP_CANCELLED, STOP_LOST, Runtime
from dtq_pyworker._version import SDK
from dtq_pyworker.errors import DtqRpcError

if TYPE_CHECKING:
    from dtq_pyworker.worker import Worker

log = logging.getLogger(__name__)

MAX_HEARTBEAT_IDS = 10_000
MAX_RETRY_INFO_S = 30.0
#: A progress report goes out on an early heartbeat this long after the previous one
#: (s): at most one extra heartbeat per second however often handlers report.
PROGRESS_DELAY_S = 1.0
#: A Lease call still waiting for its connection after this long is logged (s).
WAIT_WARN_S = 10.0
#: Codes after which retrying cannot help: the worker stops (docs/protocol.md §10).
AUTH_ERRORS = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})
FATAL_LEASE_ERRORS = AUTH_ERRORS | {grpc.StatusCode.INVALID_ARGUMENT}


def lease_request(worker: Worker) -> dtq_pb2.LeaseRequest:
    """The LeaseRequest a worker opens its sessions with."""
    task_types = worker.task_types if worker.task_types is not None else sorted(worker.handlers)
    return dtq_pb2.LeaseRequest(
        worker_id=worker.worker_id, queues=worker.queues, task_types=task_types,
        max_in_flight=worker.max_in_flight, hostname=worker.hostname, labels=worker.labels,
        concurrency=worker.lease_concurrency(), sdk=SDK)


async def lease_loop(worker: Worker, stub, runtime: Runtime,
                     session_ready: asyncio.Event) -> None:
    """Consume Lease streams forever, reconnecting with jittered backoff.

    Handlers already running keep running across reconnects; their leases stay
    valid as long as the heartbeat loop extends them. Returns when the worker is
    draining and its stream ended (with OK after a draining heartbeat: every
    lease sent has then been received), or on a fatal status; else ends only by
    cancellation.

    The call waits for the channel to be ready (``wait_for_ready``) instead of
    failing at once while the channel backs off after a failed connect: the stream
    then opens as soon as the channel reconnects, at most about
    ``worker.reconnect_max_s`` after the gateway serves again, not one more worker
    backoff step later.
    """
    backoff = Backoff(RECONNECT_INITIAL_S, worker.reconnect_max_s)
    request = lease_request(worker)
    failures = 0  # consecutive sessions that ended without delivering SessionInfo
    while not worker._draining:
        call = stub.Lease(request, wait_for_ready=True)
        worker._lease_stream_open = True
        opened, floor_s = False, 0.0
        # a call waiting for the connection fails nothing, so say that it waits
        waiting = asyncio.get_running_loop().call_later(WAIT_WARN_S, _warn_waiting, worker)
        try:
            async for response in call:
                if response.HasField("session"):
                    # a drain waits for the stream's end only once SessionInfo came: a
                    # call still waiting for its gateway carries no lease
                    worker._lease_session_open = True
                    waiting.cancel()
                    _on_session(worker, response.session)
                    session_ready.set()
                    backoff.reset()
                    opened, failures = True, 0
                elif response.HasField("task"):
                    runtime.add(response.task)
            if worker._draining:
                log.info("lease stream ended after the draining heartbeat")
                return
            log.info("lease stream ended by the gateway; reconnecting")
        except grpc.aio.AioRpcError as exc:
            floor_s = _on_stream_error(worker, DtqRpcError.from_rpc_error(exc), failures)
            if floor_s is None:
                return
        except Exception:
            log.exception("lease stream handling failed; reconnecting")
        finally:
            waiting.cancel()
            worker._lease_stream_open = worker._lease_session_open = False
            call.cancel()
        failures = 1 if opened else failures + 1
        worker._count("reconnects")
        await asyncio.sleep(max(floor_s, backoff.next()))  # RetryInfo is a lower bound


def _warn_waiting(worker: Worker) -> None:
    log.warning("gateway %s not reachable yet; the Lease call waits for the connection",
                worker.target, extra={"waited_s": WAIT_WARN_S})


def _on_stream_error(worker: Worker, err: DtqRpcError, failures: int) -> float | None:
    """Handle a failed Lease stream: None = stop leasing, else the least delay (s)
    before reconnecting (the gateway's RetryInfo, capped)."""
    if err.code in FATAL_LEASE_ERRORS:
        worker._stop_fatally(err)
        return None
    if worker._draining:
        log.info("lease stream failed while draining: %s", err)
        return None
    _log_stream_error(err, failures)
    return min(MAX_RETRY_INFO_S, err.retry_after_s or 0.0)


def _log_stream_error(err: DtqRpcError, failures: int) -> None:
    """Warn on the first failure of a streak and every 10th; the rest at debug level."""
    if err.code == grpc.StatusCode.UNIMPLEMENTED:
        level = logging.ERROR
    elif failures % 10 == 0:
        level = logging.WARNING
    else:
        level = logging.DEBUG
    log.log(level, "lease stream failed; reconnecting: %s", err,
             extra={"consecutive_failures": failures + 1})


def _on_session(worker: Worker, session: dtq_pb2.SessionInfo) -> None:
    worker.session = session
    if session.heartbeat_interval_ms:
        worker._heartbeat_interval_ms = session.heartbeat_interval_ms
    log.info("lease session open", extra={
        "session_id": session.session_id, "gateway_id": session.gateway_id,
        "heartbeat_interval_ms": session.heartbeat_interval_ms,
        "visibility_timeout_ms": session.visibility_timeout_ms,
        "max_in_flight": session.max_in_flight})
    if session.max_in_flight and session.max_in_flight < worker.max_in_flight:
        log.info("gateway granted a lower max_in_flight",
                 extra={"requested": worker.max_in_flight, "granted": session.max_in_flight})


async def heartbeat_loop(worker: Worker, stub, runtime: Runtime,
                         session_ready: asyncio.Event, stop: asyncio.Event) -> None:
    """Send a Heartbeat every interval listing every held lease, until ``stop``.

    The first heartbeat goes out one interval after the first session opened;
    each next one an interval after the previous answer, using the interval of
    the latest SessionInfo or HeartbeatResponse. Lost leases are stopped
    silently (a result already handed to the reporter is still sent: see
    :func:`_heartbeat_once`), cancelled ones stopped and reported.
    """
    await session_ready.wait()
    failures = 0
    loop = asyncio.get_running_loop()
    last_at = last_progress_at = loop.time()
    while True:
        interval_ms = worker._heartbeat_interval_ms or 5000
        # after a failed heartbeat, try again sooner: the leases are running out
        wait_ms = interval_ms / 3 if failures else interval_ms
        beat = await _beat_due(stop, runtime.progress_pending, last_at, last_progress_at,
                               wait_ms / 1000.0)
        if beat is None:
            return
        if beat == "progress":  # only the leases with a new report; the schedule stays
            last_progress_at = loop.time()
            # a report lost with a failed call is superseded by the handler's next one
            with contextlib.suppress(grpc.aio.AioRpcError):
                await _heartbeat_once(worker, stub, runtime, interval_ms, progress_only=True)
            continue
        last_at = last_progress_at = loop.time()
        try:
            response = await _heartbeat_once(worker, stub, runtime, interval_ms)
        except grpc.aio.AioRpcError as exc:
            err = DtqRpcError.from_rpc_error(exc)
            if err.code in AUTH_ERRORS:
                worker._stop_fatally(err)
            level = logging.WARNING if failures % 10 == 0 else logging.DEBUG
            failures += 1
            log.log(level, "heartbeat failed: %s", err, extra={"consecutive_failures": failures})
            continue
        failures = 0
        if response.heartbeat_interval_ms:
            worker._heartbeat_interval_ms = response.heartbeat_interval_ms


async def _beat_due(stop: asyncio.Event, progress: asyncio.Event, last_at: float,
                    last_progress_at: float, interval_s: float) -> str | None:
    """Wait for the next heartbeat; loop times in s.

    Returns ``"full"`` ``interval_s`` after ``last_at`` (the regular heartbeat: every
    lease), ``"progress"`` once a handler reported progress and PROGRESS_DELAY_S have
    passed since ``last_progress_at`` (an early heartbeat with just the leases that
    have a report), whichever comes first; None when ``stop`` was set instead.
    Clears ``progress`` when it returns ``"progress"`` or ``"full"``.
    """
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        now = loop.time()
        if now >= last_at + interval_s:
            progress.clear()
            return "full"
        due = last_at + interval_s
        if progress.is_set():
            if now >= last_progress_at + PROGRESS_DELAY_S:
                progress.clear()
                return "progress"
            due = min(due, last_progress_at + PROGRESS_DELAY_S)
        waits = [asyncio.ensure_future(stop.wait())]
        if not progress.is_set():
            waits.append(asyncio.ensure_future(progress.wait()))
        try:
            await asyncio.wait(waits, timeout=due - now, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
    return None


async def drain_heartbeat(worker: Worker, stub, runtime: Runtime) -> None:
    """Send the first draining heartbeat at once (the loop repeats it every interval).

    From it on the gateway delivers nothing new to this worker and ends its Lease
    streams with OK after every lease already sent. Failures are only logged: the
    heartbeat loop retries, and the bounded stream wait keeps the drain finite.
    """
    interval_ms = worker._heartbeat_interval_ms or 5000
    try:
        await _heartbeat_once(worker, stub, runtime, interval_ms)
    except grpc.aio.AioRpcError as exc:
        log.warning("draining heartbeat failed: %s", DtqRpcError.from_rpc_error(exc))


async def send_final_progress(worker: Worker, stub,
                              reports: list[dtq_pb2.TaskProgress]) -> None:
    """Send handlers' last progress reports on a Heartbeat listing just their leases,
    ahead of those leases' Ack or Fail (the reporter awaits it), so a report made right
    before a handler returned is stored on the task.

    Raises:
        grpc.aio.AioRpcError: the call failed (the reporter logs it and sends the
            results anyway).
    """
    interval_ms = worker._heartbeat_interval_ms or 5000
    runtime = worker._runtime
    request = dtq_pb2.HeartbeatRequest(
        worker_id=worker.worker_id, lease_ids=[r.lease_id for r in reports],
        counters=worker.counters(), concurrency=worker.concurrency,
        active_tasks=runtime.busy_slots() if runtime is not None else 0,
        hostname=worker.hostname, draining=worker._draining, progress=reports)
    await stub.Heartbeat(request, timeout=max(1.0, interval_ms / 1000.0))


async def _heartbeat_once(worker: Worker, stub, runtime: Runtime, interval_ms: int,
                          progress_only: bool = False) -> dtq_pb2.HeartbeatResponse:
    """One Heartbeat: every held lease (or, with ``progress_only``, just the leases
    with an unsent progress report), the counters and the progress reports; stops
    what the answer says is lost or cancelled.

    Results already queued in the reporter are not dropped for a lost lease: they are
    sent and counted by the gateway's answer (a duplicate success when an earlier send
    was applied but its reply lost, STALE_LEASE when the lease really ended)."""
    progress = runtime.progress_reports()
    if progress_only:
        if not progress:
            return dtq_pb2.HeartbeatResponse()
        ids = [p.lease_id for p in progress]
    else:
        ids = runtime.all_lease_ids()[:MAX_HEARTBEAT_IDS]
    request = dtq_pb2.HeartbeatRequest(
        worker_id=worker.worker_id, lease_ids=ids, counters=worker.counters(),
        active_tasks=runtime.busy_slots(), concurrency=worker.concurrency,
        hostname=worker.hostname, draining=worker._draining, progress=progress)
    response = await stub.Heartbeat(request, timeout=max(1.0, interval_ms / 1000.0))
    lost = runtime.stop(response.lost_lease_ids, STOP_LOST)
    # A result the reporter still holds stays queued: its lease may be lost only
    # because an earlier send was applied and its reply never came (then the resend is
    # answered as a duplicate success); else the gateway fences it (STALE_LEASE,
    # nothing changes). Either way the answer, not this list, decides how it counts.
    unsent = len(set(response.lost_lease_ids) & runtime.reporter.pending_ids())
    cancelled = runtime.stop(response.cancelled_lease_ids, STOP_CANCELLED)
    if lost or cancelled or unsent:
        log.info("heartbeat stopped tasks", extra={
            "lost": lost, "cancelled": cancelled, "lost_with_result_unanswered": unsent})
    return response
