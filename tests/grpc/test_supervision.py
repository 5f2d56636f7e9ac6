"""The gateway's one lifetime: supervised background tasks, a start that fails midway,
a stop step that raises (issue 22)."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from dtq_gateway.health_probe import ENQUEUE_HEALTH, SERVICE_NAMES
from dtq_gateway.server import Gateway
from dtq_proto import dtq_pb2 as pb
from tests.conftest import gateway_settings
from tests.support.leasing import LeaseStream, wait_until
from tests.support.redis_server import free_port

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def wait_until_10(predicate: Callable[[], object]) -> Awaitable[object]:
    """:func:`wait_until` with a 10 s deadline (a restart waits out its backoff)."""
    return wait_until(predicate, timeout_s=10.0)


def restarts(task: str) -> float:
    return REGISTRY.get_sample_value("dtq_background_task_restarts_total",
                                     {"task": task}) or 0.0


def running_dtq_tasks() -> list[str]:
    return sorted(t.get_name() for t in asyncio.all_tasks()
                  if t.get_name().startswith("dtq-") and not t.done())


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def health_of(gw: Gateway) -> dict[str, int]:
    """Every service's status through the real grpc health RPC."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        return {name: (await stub.Check(health_pb2.HealthCheckRequest(service=name),
                                        timeout=5)).status
                for name in ("", *SERVICE_NAMES, ENQUEUE_HEALTH)}


@pytest.mark.parametrize("task", ["health", "events-hub", "metrics-refresh", "dispatcher",
                                  "scheduler"])
async def test_a_background_task_that_ends_is_restarted(gateway, task, caplog):
    before = restarts(task)
    old = gateway.supervisor.task(task)
    assert old is not None and not old.done()
    old.cancel()
    await wait_until_10(lambda: restarts(task) == before + 1)
    new = gateway.supervisor.task(task)
    assert new is not old and not new.done()
    assert set((await health_of(gateway)).values()) == {SERVING}
    assert [r.getMessage().split(";")[0] for r in caplog.records
            if r.levelno == logging.WARNING and r.name == "dtq_gateway.supervisor"] == \
        [f"background task {task} ended (cancelled)"]


async def test_a_restarted_dispatcher_and_hub_serve_again(gateway, broker_stub):
    """Not only a new task: leases are handed out and events arrive after the restart."""
    for task in ("dispatcher", "events-hub"):
        before = restarts(task)
        gateway.supervisor.task(task).cancel()
        await wait_until_10(lambda task=task, before=before: restarts(task) == before + 1)
    await wait_until_10(gateway.ops.hub.connected.is_set)  # resubscribed
    seen: list[str] = []
    gateway.ops.hub.add_listener(lambda event: seen.append(event.get("type", "")))
    # enqueued before the stream opens: the dispatch loop (not the enqueue's read-ahead
    # for an idle stream) must hand it out
    done = await broker_stub.Enqueue(pb.EnqueueRequest(queue="after-restart", task_type="t"))
    lease = await LeaseStream(broker_stub, "w-restart", ["after-restart"]).open()
    try:
        task = await lease.next(timeout_s=10)
        assert task.task_id == done.task_id
    finally:
        lease.close()
    await wait_until_10(lambda: "TASK_QUEUED" in seen)


async def test_a_leader_duty_that_dies_restarts_the_scheduler_and_its_duties(gateway):
    before = restarts("scheduler")
    reaper = next(t for t in asyncio.all_tasks() if t.get_name() == "dtq-reaper")
    reaper.cancel()
    await wait_until_10(lambda: restarts("scheduler") == before + 1)
    await wait_until_10(lambda: any(t.get_name() == "dtq-reaper" and t is not reaper
                                 for t in asyncio.all_tasks() if not t.done()))
    await wait_until_10(lambda: gateway.scheduler.is_leader)  # the lock is sought again


async def test_a_task_that_keeps_failing_turns_every_service_not_serving(gateway, caplog):
    async def broken() -> None:
        raise RuntimeError("hub bug")

    gateway.supervisor.max_restarts = 2
    gateway.supervisor.base_backoff_s = 0.01
    gateway.ops.hub._run = broken  # every restart fails at once
    gateway.supervisor.task("events-hub").cancel()
    await wait_until_10(lambda: "events-hub" in gateway.supervisor.failed)
    assert restarts("events-hub") >= 2
    statuses = await health_of(gateway)
    assert set(statuses.values()) == {NOT_SERVING}, statuses
    await gateway.probe.check_once()  # Redis answers: a later probe does not undo it
    assert set((await health_of(gateway)).values()) == {NOT_SERVING}
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert "background task events-hub failed 3 times" in errors[0]
    assert "hub bug" in errors[0] and errors[0].endswith("health NOT_SERVING")


async def test_a_start_that_fails_midway_leaves_nothing_running(redis_url, monkeypatch):
    metrics_port, dashboard_port = free_port(), free_port()
    gw = Gateway(gateway_settings(redis_url, metrics_port=metrics_port,
                                  dashboard_port=dashboard_port), redis_url)

    def broken_start() -> None:
        raise RuntimeError("dispatcher start failed")

    monkeypatch.setattr(gw.dispatcher, "start", broken_start)
    with pytest.raises(RuntimeError, match="dispatcher start failed"):
        await gw.start()
    assert gw.port and gw.server is not None
    assert running_dtq_tasks() == []  # the scheduler had started: it was stopped
    for port in (gw.port, metrics_port, dashboard_port):  # every listener closed
        await wait_until_10(lambda port=port: port_is_free(port))
    assert not gw.scheduler.is_leader


async def test_a_stop_step_that_raises_does_not_skip_the_later_steps(redis_url, caplog):
    gw = Gateway(gateway_settings(redis_url), redis_url)
    real_stop = gw.dispatcher.stop

    async def broken_stop() -> None:
        await real_stop()
        raise RuntimeError("dispatcher stop failed")

    gw.dispatcher.stop = broken_stop  # type: ignore[method-assign]
    caplog.set_level(logging.INFO, logger="dtq_gateway")
    await gw.start()
    port = gw.port
    await gw.stop()
    assert running_dtq_tasks() == []  # the scheduler, hub, refresher, probe stopped
    await wait_until_10(lambda: port_is_free(port))  # the gRPC server stopped after it
    assert any(r.getMessage() == "stop step failed: dispatcher" and r.exc_info
               for r in caplog.records)
    assert caplog.records[-1].getMessage() == "stopped"
