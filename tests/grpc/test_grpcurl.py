"""Operators' view: Admin, health and reflection through the real grpcurl binary,
plaintext, with no proto files (everything comes from server reflection)."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

import pytest

from dtq_proto import dtq_pb2 as pb
from tests.support.leasing import LeaseStream

GRPCURL = shutil.which("grpcurl", path=str(Path(sys.executable).parent)) or shutil.which("grpcurl")
pytestmark = pytest.mark.skipif(GRPCURL is None, reason="grpcurl not installed (make install)")


async def grpcurl(port: int, *args: str, data: dict | None = None) -> tuple[int, str]:
    """Run grpcurl without blocking the event loop the gateway runs on."""
    cmd = [GRPCURL, "-plaintext", "-emit-defaults"]
    if data is not None:
        cmd += ["-d", json.dumps(data)]
    cmd += [*args[:-1], f"127.0.0.1:{port}", args[-1]] if len(args) > 1 or args[0] != "list" \
        else [f"127.0.0.1:{port}", "list"]
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode, out.decode()


async def test_list_shows_every_service(gateway):
    rc, out = await grpcurl(gateway.port, "list")
    assert rc == 0, out
    services = set(out.split())
    assert {"dtq.v1.Broker", "dtq.v1.Admin", "dtq.v1.Events", "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection"} <= services


async def test_health_is_serving(gateway):
    rc, out = await grpcurl(gateway.port, "grpc.health.v1.Health/Check")
    assert rc == 0 and json.loads(out)["status"] == "SERVING"


async def test_queue_stats_pause_and_audit(gateway, broker_stub):
    await broker_stub.Enqueue(pb.EnqueueRequest(queue="mail", task_type="send", priority=0))
    rc, out = await grpcurl(gateway.port, "dtq.v1.Admin/ListQueues")
    assert rc == 0, out
    assert [q["name"] for q in json.loads(out)["queues"]] == ["mail"]
    rc, out = await grpcurl(gateway.port, "dtq.v1.Admin/GetQueueStats", data={"queue": "mail"})
    stats = json.loads(out)
    assert stats["depth"] == "1" and stats["paused"] is False
    assert {b["band"]: b["depth"] for b in stats["bands"]}[0] == "1"
    rc, out = await grpcurl(gateway.port, "-H", "x-request-id: op-7", "dtq.v1.Admin/PauseQueue",
                            data={"queue": "mail", "reason": "maintenance"})
    assert rc == 0 and json.loads(out) == {"changed": True, "request_id": "op-7"}
    rc, out = await grpcurl(gateway.port, "dtq.v1.Admin/ListAudit")
    entry = json.loads(out)["entries"][0]
    assert (entry["action"], entry["task_id"], entry["request_id"]) == \
        ("pause_queue", "mail", "op-7")


async def test_bad_input_is_invalid_argument_with_the_field(gateway):
    rc, out = await grpcurl(gateway.port, "dtq.v1.Admin/GetQueueStats",
                            data={"queue": "no spaces allowed"})
    assert rc != 0
    assert "InvalidArgument" in out and "queue" in out


async def test_dead_letter_list_and_requeue(gateway, broker_stub):
    r = await broker_stub.Enqueue(pb.EnqueueRequest(queue="q", task_type="t"))
    lease = await LeaseStream(broker_stub, "w1", ["q"]).open()
    task = await lease.next()
    await broker_stub.Fail(pb.FailRequest(items=[pb.FailItem(
        lease_id=task.lease_id, retryable=False, error_class="Corrupt", error_message="bad")]))
    rc, out = await grpcurl(gateway.port, "dtq.v1.Admin/ListDeadLetters")
    (entry,) = json.loads(out)["entries"]
    assert (entry["task_id"], entry["last_error_class"]) == (r.task_id, "Corrupt")
    rc, out = await grpcurl(gateway.port, "dtq.v1.Admin/RequeueDeadLetter",
                            data={"task_id": r.task_id})
    assert rc == 0, out
    again = await lease.next()
    assert (again.task_id, again.attempt) == (r.task_id, 1)
    rc, out = await grpcurl(gateway.port, "dtq.v1.Admin/ListDeadLetters")
    assert json.loads(out).get("entries", []) == []
    lease.close()


async def describe(port: int, symbol: str) -> tuple[int, str]:
    """``grpcurl -plaintext ADDRESS describe SYMBOL``."""
    proc = await asyncio.create_subprocess_exec(
        GRPCURL, "-plaintext", f"127.0.0.1:{port}", "describe", symbol,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode, out.decode()


async def test_describe_resolves_services_methods_and_messages(gateway):
    for symbol, expected in (
            ("dtq.v1.Admin.ListQueues", "rpc ListQueues ( .dtq.v1.ListQueuesRequest )"),
            ("dtq.v1.Broker.Enqueue", "rpc Enqueue ( .dtq.v1.EnqueueRequest )"),
            ("dtq.v1.Admin", "service Admin {"),
            ("dtq.v1.GetQueueStatsRequest", "message GetQueueStatsRequest {")):
        rc, out = await describe(gateway.port, symbol)
        assert rc == 0 and expected in out, (symbol, out)


async def test_describe_of_an_unknown_method_is_not_found(gateway):
    rc, out = await describe(gateway.port, "dtq.v1.Admin.NoSuchMethod")
    assert rc != 0 and "Symbol not found" in out
