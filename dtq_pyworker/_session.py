"""The Lease stream consumer (with reconnect) and the heartbeat loop of a Worker."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import grpc

from dtq_proto import dtq_pb2
from dtq_pyworker._backoff import Backoff
from dtq_pyworker._runtime import STOP_CANCELLED, STOP_LOST, Runtime
from dtq_pyworker.errors import DtqRpcError

if TYPE_CHECKING:
    from dtq_pyworker.worker import Worker

log = logging.getLogger(__name__)

MAX_HEARTBEAT_IDS = 10_000
_CONFIG_ERRORS = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNIMPLEMENTED,
                            grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})


def lease_request(worker: Worker) -> dtq_pb2.LeaseRequest:
    """The LeaseRequest a worker opens its sessions with."""
    task_types = worker.task_types if worker.task_types is not None else sorted(worker.handlers)
    return dtq_pb2.LeaseRequest(
        worker_id=worker.worker_id, queues=worker.queues, task_types=task_types,
        max_in_flight=worker.max_in_flight, hostname=worker.hostname, labels=worker.labels,
        concurrency=worker.concurrency, sdk="dtq-pyworker/0.1.0")


async def lease_loop(worker: Worker, stub, runtime: Runtime,
                     session_ready: asyncio.Event) -> None:
    """Consume Lease streams forever, reconnecting with jittered backoff.

    Handlers already running keep running across reconnects; their leases stay
    valid as long as the heartbeat loop extends them. Ends only by cancellation.
    """
    backoff = Backoff(0.1, 5.0)
    request = lease_request(worker)
    while True:
        call = stub.Lease(request)
        try:
            async for response in call:
                if response.HasField("session"):
                    _on_session(worker, response.session)
                    session_ready.set()
                    backoff.reset()
                elif response.HasField("task"):
                    runtime.add(response.task)
            log.info("lease stream ended by the gateway; reconnecting")
        except grpc.aio.AioRpcError as exc:
            err = DtqRpcError.from_rpc_error(exc)
            level = logging.ERROR if err.code in _CONFIG_ERRORS else logging.WARNING
            log.log(level, "lease stream failed; reconnecting: %s", err)
        except Exception:
            log.exception("lease stream handling failed; reconnecting")
        finally:
            call.cancel()
        worker._count("reconnects")
        await asyncio.sleep(backoff.next())


def _on_session(worker: Worker, session: dtq_pb2.SessionInfo) -> None:
    worker.session = session
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

    The first heartbeat goes out one interval after the first session opened.
    Lost leases are stopped silently, cancelled ones stopped and reported.
    """
    await session_ready.wait()
    interval_ms = worker.session.heartbeat_interval_ms or 5000
    while True:
        try:
            await asyncio.wait_for(stop.wait(), interval_ms / 1000.0)
            return
        except TimeoutError:
            pass
        if worker.session and worker.session.heartbeat_interval_ms:
            interval_ms = worker.session.heartbeat_interval_ms
        response = await _heartbeat_once(worker, stub, runtime, interval_ms)
        if response is not None and response.heartbeat_interval_ms:
            interval_ms = response.heartbeat_interval_ms


async def _heartbeat_once(worker: Worker, stub, runtime: Runtime,
                          interval_ms: int) -> dtq_pb2.HeartbeatResponse | None:
    ids = runtime.all_lease_ids()[:MAX_HEARTBEAT_IDS]
    request = dtq_pb2.HeartbeatRequest(
        worker_id=worker.worker_id, lease_ids=ids, counters=worker.counters(),
        active_tasks=len(runtime.running), concurrency=worker.concurrency,
        hostname=worker.hostname)
    try:
        response = await stub.Heartbeat(request, timeout=max(1.0, interval_ms / 1000.0))
    except grpc.aio.AioRpcError as exc:
        log.warning("heartbeat failed: %s", DtqRpcError.from_rpc_error(exc))
        return None
    lost = runtime.stop(response.lost_lease_ids, STOP_LOST)
    cancelled = runtime.stop(response.cancelled_lease_ids, STOP_CANCELLED)
    if lost or cancelled:
        log.info("heartbeat stopped tasks", extra={"lost": lost, "cancelled": cancelled})
    return response
