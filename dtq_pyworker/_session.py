"""The Lease stream consumer (with reconnect) and the heartbeat loop of a Worker.

The loops know their worker only through a :class:`SessionState`: its identity, the
LeaseRequest, the runtime holding its leases, three callbacks, and the facts the loops
learn and the worker reads back (SessionInfo, heartbeat interval, draining, stream
open). They never import the Worker, so the worker module depends on this one and not
the other way round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from dtq_proto import dtq_pb2
from dtq_pyworker._backoff import Backoff
from dtq_pyworker._channel import RECONNECT_INITIAL_S
from dtq_pyworker._runtime import STOP_CANCELLED, STOP_LOST, Runtime
from dtq_pyworker.errors import DtqRpcError

log = logging.getLogger(__name__)

MAX_HEARTBEAT_IDS = 10_000
MAX_RETRY_INFO_S = 30.0
#: Most tasks one Lease stream message may carry (LeaseRequest.max_batch, 0..256).
MAX_LEASE_BATCH = 256
#: A progress report goes out on an early heartbeat this long after the previous one
#: (s): at most one extra heartbeat per second however often handlers report.
PROGRESS_DELAY_S = 1.0
#: A Lease call still waiting for its connection after this long is logged (s).
WAIT_WARN_S = 10.0
#: Codes after which retrying cannot help: the worker stops (docs/protocol.md §10).
AUTH_ERRORS = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})
FATAL_LEASE_ERRORS = AUTH_ERRORS | {grpc.StatusCode.INVALID_ARGUMENT}


@dataclass(eq=False)
class SessionState:
    """What the Lease and heartbeat loops share with their worker.

    Attributes:
        request: The LeaseRequest every session opens with.
        runtime: The worker's held leases (tasks go in, lease ids come out).
        target: Gateway address (for logs).
        hostname: Sent in heartbeats.
        concurrency: Handler slots, sent in heartbeats.
        reconnect_max_s: Cap of the Lease reconnect backoff, in s.
        counters: Returns the cumulative counters a heartbeat carries.
        count: ``count(name)`` bumps a worker counter (``reconnects``).
        stop_fatally: Called with the error when the gateway refused the worker for
            good (it drains, then raises it).
        session: SessionInfo of the latest session (None before the first).
        heartbeat_interval_ms: Latest interval from SessionInfo or a heartbeat
            answer, in ms (0 = none yet: 5000 is used).
        draining: Set by the worker when it drains: sent in every heartbeat; the
            Lease loop then stops reconnecting.
        stream_open: True while a Lease call is open (or waits for its connection).
        session_open: True once that call's SessionInfo came (leases may follow).
    """

    request: dtq_pb2.LeaseRequest
    runtime: Runtime
    target: str
    hostname: str
    concurrency: int
    reconnect_max_s: float
    counters: Callable[[], dtq_pb2.WorkerCounters]
    count: Callable[[str], None]
    stop_fatally: Callable[[DtqRpcError], None]
    session: dtq_pb2.SessionInfo | None = None
    heartbeat_interval_ms: int = 0
    draining: bool = False
    stream_open: bool = False
    session_open: bool = False

    @property
    def worker_id(self) -> str:
        """The worker id of the LeaseRequest (and of every heartbeat)."""
        return self.request.worker_id

    @property
    def interval_ms(self) -> int:
        """The heartbeat interval in force, in ms (5000 until a gateway said one)."""
        return self.heartbeat_interval_ms or 5000


async def lease_loop(state: SessionState, stub: Any, session_ready: asyncio.Event) -> None:
    """Consume Lease streams forever, reconnecting with jittered backoff.

    Handlers already running keep running across reconnects; their leases stay
    valid as long as the heartbeat loop extends them. Returns when the worker is
    draining and its stream ended (with OK after a draining heartbeat: every
    lease sent has then been received), or on a fatal status; else ends only by
    cancellation.

    The call waits for the channel to be ready (``wait_for_ready``) instead of
    failing at once while the channel backs off after a failed connect: the stream
    then opens as soon as the channel reconnects, at most about
    ``state.reconnect_max_s`` after the gateway serves again, not one more worker
    backoff step later.
    """
    backoff = Backoff(RECONNECT_INITIAL_S, state.reconnect_max_s)
    failures = 0  # consecutive sessions that ended without delivering SessionInfo
    while not state.draining:
        call = stub.Lease(state.request, wait_for_ready=True)
        state.stream_open = True
        opened, floor_s = False, 0.0
        # a call waiting for the connection fails nothing, so say that it waits
        waiting = asyncio.get_running_loop().call_later(WAIT_WARN_S, _warn_waiting, state)
        try:
            async for response in call:
                kind = response.WhichOneof("kind")
                if kind == "batch":  # the common case first: one message, many tasks
                    state.runtime.add_many(response.batch.tasks)
                elif kind == "task":
                    state.runtime.add(response.task)
                elif kind == "cancelled":  # as a heartbeat's cancelled_lease_ids
                    if state.runtime.stop(response.cancelled.lease_ids, STOP_CANCELLED):
                        log.info("cancel notice stopped tasks", extra={
                            "cancelled": len(response.cancelled.lease_ids)})
                elif kind == "session":
                    # a drain waits for the stream's end only once SessionInfo came: a
                    # call still waiting for its gateway carries no lease
                    state.session_open = True
                    waiting.cancel()
                    _on_session(state, response.session)
                    session_ready.set()
                    backoff.reset()
                    opened, failures = True, 0
            if state.draining:
                log.info("lease stream ended after the draining heartbeat")
                return
            log.info("lease stream ended by the gateway; reconnecting")
        except grpc.aio.AioRpcError as exc:
            least_delay_s = _on_stream_error(state, DtqRpcError.from_rpc_error(exc), failures)
            if least_delay_s is None:
                return
            floor_s = least_delay_s
        except Exception:
            log.exception("lease stream handling failed; reconnecting")
        finally:
            waiting.cancel()
            state.stream_open = state.session_open = False
            call.cancel()
        failures = 1 if opened else failures + 1
        state.count("reconnects")
        await asyncio.sleep(max(floor_s, backoff.next()))  # RetryInfo is a lower bound


def _warn_waiting(state: SessionState) -> None:
    log.warning("gateway %s not reachable yet; the Lease call waits for the connection",
                state.target, extra={"waited_s": WAIT_WARN_S})


def _on_stream_error(state: SessionState, err: DtqRpcError, failures: int) -> float | None:
    """Handle a failed Lease stream: None = stop leasing, else the least delay (s)
    before reconnecting (the gateway's RetryInfo, capped)."""
    if err.code in FATAL_LEASE_ERRORS:
        state.stop_fatally(err)
        return None
    if state.draining:
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


def _on_session(state: SessionState, session: dtq_pb2.SessionInfo) -> None:
    state.session = session
    if session.heartbeat_interval_ms:
        state.heartbeat_interval_ms = session.heartbeat_interval_ms
    log.info("lease session open", extra={
        "session_id": session.session_id, "gateway_id": session.gateway_id,
        "heartbeat_interval_ms": session.heartbeat_interval_ms,
        "visibility_timeout_ms": session.visibility_timeout_ms,
        "max_in_flight": session.max_in_flight, "max_batch": session.max_batch})
    asked = state.request.max_in_flight
    if session.max_in_flight and session.max_in_flight < asked:
        log.info("gateway granted a lower max_in_flight",
                 extra={"requested": asked, "granted": session.max_in_flight})


async def heartbeat_loop(state: SessionState, stub: Any, session_ready: asyncio.Event,
                         stop: asyncio.Event) -> None:
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
        interval_ms = state.interval_ms
        # after a failed heartbeat, try again sooner: the leases are running out
        wait_ms = interval_ms / 3 if failures else interval_ms
        beat = await _beat_due(stop, state.runtime.progress_pending, last_at, last_progress_at,
                               wait_ms / 1000.0)
        if beat is None:
            return
        if beat == "progress":  # only the leases with a new report; the schedule stays
            last_progress_at = loop.time()
            # a report lost with a failed call is superseded by the handler's next one
            with contextlib.suppress(grpc.aio.AioRpcError):
                await _heartbeat_once(state, stub, progress_only=True)
            continue
        last_at = last_progress_at = loop.time()
        try:
            response = await _heartbeat_once(state, stub)
        except grpc.aio.AioRpcError as exc:
            err = DtqRpcError.from_rpc_error(exc)
            if err.code in AUTH_ERRORS:
                state.stop_fatally(err)
            level = logging.WARNING if failures % 10 == 0 else logging.DEBUG
            failures += 1
            log.log(level, "heartbeat failed: %s", err, extra={"consecutive_failures": failures})
            continue
        failures = 0
        if response.heartbeat_interval_ms:
            state.heartbeat_interval_ms = response.heartbeat_interval_ms


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


async def drain_heartbeat(state: SessionState, stub: Any) -> None:
    """Send the first draining heartbeat at once (the loop repeats it every interval).

    From it on the gateway delivers nothing new to this worker and ends its Lease
    streams with OK after every lease already sent. Failures are only logged: the
    heartbeat loop retries, and the bounded stream wait keeps the drain finite.
    """
    try:
        await _heartbeat_once(state, stub)
    except grpc.aio.AioRpcError as exc:
        log.warning("draining heartbeat failed: %s", DtqRpcError.from_rpc_error(exc))


def _request(state: SessionState, lease_ids: list[str],
             progress: list[dtq_pb2.TaskProgress]) -> dtq_pb2.HeartbeatRequest:
    return dtq_pb2.HeartbeatRequest(
        worker_id=state.worker_id, lease_ids=lease_ids, counters=state.counters(),
        active_tasks=state.runtime.busy_slots(), concurrency=state.concurrency,
        hostname=state.hostname, draining=state.draining, progress=progress)


async def send_final_progress(state: SessionState, stub: Any,
                              reports: list[dtq_pb2.TaskProgress]) -> None:
    """Send handlers' last progress reports on a Heartbeat listing just their leases,
    ahead of those leases' Ack or Fail (the reporter awaits it), so a report made right
    before a handler returned is stored on the task.

    Raises:
        grpc.aio.AioRpcError: the call failed (the reporter logs it and sends the
            results anyway).
    """
    request = _request(state, [r.lease_id for r in reports], reports)
    await stub.Heartbeat(request, timeout=max(1.0, state.interval_ms / 1000.0))


async def _heartbeat_once(state: SessionState, stub: Any,
                          progress_only: bool = False) -> dtq_pb2.HeartbeatResponse:
    """One Heartbeat: every held lease (or, with ``progress_only``, just the leases
    with an unsent progress report), the counters and the progress reports; stops
    what the answer says is lost or cancelled.

    Results already queued in the reporter are not dropped for a lost lease: they are
    sent and counted by the gateway's answer (a duplicate success when an earlier send
    was applied but its reply lost, STALE_LEASE when the lease really ended)."""
    runtime = state.runtime
    progress = runtime.progress_reports()
    if progress_only:
        if not progress:
            return dtq_pb2.HeartbeatResponse()
        ids = [p.lease_id for p in progress]
    else:
        ids = runtime.all_lease_ids()[:MAX_HEARTBEAT_IDS]
    request = _request(state, ids, progress)
    response: dtq_pb2.HeartbeatResponse = await stub.Heartbeat(
        request, timeout=max(1.0, state.interval_ms / 1000.0))
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
