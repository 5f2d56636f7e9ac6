"""The dtq-pyworker CLI as a real process: loading module:attr, flags, SIGTERM drain."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path

import pytest

from dtq_proto import dtq_pb2

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).parent / "dtq-pyworker"


@pytest.fixture(autouse=True)
def _root_logging_restored():
    """main() in-process sets the root logger's handler to this test's captured stderr
    (configure_logging): put the previous handlers back, or later tests in this process
    log into a closed stream ("--- Logging error ---" in their own stderr)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


async def _spawn(*args: str) -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTQ_")}
    cmd = [str(CLI)] if CLI.exists() else [sys.executable, "-m", "dtq_pyworker.cli"]
    return await asyncio.create_subprocess_exec(
        *cmd, *args, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)


async def test_cli_runs_worker_and_exits_zero_after_sigterm_drain(fake):
    proc = await _spawn("tests.worker.cli_app:worker", "--target", fake.target,
                        "--queues", "a,b", "--concurrency", "3", "--worker-id", "cli-w")
    try:
        await fake.wait_for(lambda: fake.open_streams == 1, timeout_s=20)
        req = fake.lease_requests[0]
        assert (list(req.queues), req.concurrency, req.max_in_flight, req.worker_id) == (
            ["a", "b"], 3, 6, "cli-w")
        echo = await fake.push("echo", b'{"x": 1}')
        await fake.wait_for(lambda: echo in fake.acked())
        assert json.loads(fake.acked()[echo]) == {"echo": {"x": 1}, "worker_id": "cli-w"}
        slow = await fake.push("slow", b'{"seconds": 0.5}')
        await fake.wait_for(lambda: any(slow in h.lease_ids for h in fake.heartbeats))
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(proc.wait(), 20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    output = (await proc.stdout.read()).decode()
    assert rc == 0, output
    assert json.loads(fake.acked()[slow]) == {"slept": 0.5}  # finished within the grace
    assert "draining" in output


async def test_cli_accepts_a_factory_and_env_defaults(fake):
    env_target = fake.target
    proc = await asyncio.create_subprocess_exec(
        *([str(CLI)] if CLI.exists() else [sys.executable, "-m", "dtq_pyworker.cli"]),
        "tests.worker.cli_app:build", cwd=ROOT,
        env={**os.environ, "DTQ_GATEWAY": env_target, "DTQ_QUEUES": "envq",
             "DTQ_CONCURRENCY": "2"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        await fake.wait_for(lambda: fake.open_streams == 1, timeout_s=20)
        req = fake.lease_requests[0]
        assert (list(req.queues), req.concurrency, req.worker_id) == (["envq"], 2, "cli-built")
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_cli_bad_spec_exits_2():
    proc = await _spawn("tests.worker.cli_app:nope")
    rc = await asyncio.wait_for(proc.wait(), 20)
    output = (await proc.stdout.read()).decode()
    assert rc == 2 and "cannot load" in output
    proc = await _spawn("no_colon_here")
    assert await asyncio.wait_for(proc.wait(), 20) == 2


def test_cli_refuses_more_queues_than_a_lease_session_takes(capsys):
    from dtq_pyworker.cli import main

    queues = ",".join(f"q{i}" for i in range(33))
    assert main(["tests.worker.cli_app:worker", "--queues", queues]) == 2
    assert "1..32 queue names" in capsys.readouterr().err


def test_cli_checks_the_queues_before_importing_the_module(capsys):
    """A module that cannot be imported must not hide a bad --queues (both exit 2, but
    only the queues error says what to fix in the flags)."""
    from dtq_pyworker.cli import main

    queues = ",".join(f"q{i}" for i in range(33))
    assert main(["no_such_module_anywhere:worker", "--queues", queues]) == 2
    err = capsys.readouterr().err
    assert "--queues: 1..32 queue names" in err and "cannot load" not in err
    assert "no_such_module_anywhere" not in sys.modules
    assert main(["no_such_module_anywhere:worker", "--queues", "ok,bad queue!"]) == 2
    assert "--queues: 'bad queue!' is not a queue name" in capsys.readouterr().err


@pytest.mark.parametrize("target", ["127.0.0.1:88697", "localhost", "127.0.0.1:+1", "::1",
                                    "http://gw:50051", "unix:"])
def test_cli_refuses_a_target_grpc_would_misread(capsys, target):
    """--target (or DTQ_GATEWAY) is checked like --queues, before the module is loaded:
    exit 2 with the flag named, not a traceback from Worker.run()."""
    from dtq_pyworker.cli import main

    assert main(["tests.worker.cli_app:worker", "--target", target]) == 2
    assert f"--target: '{target}' " in capsys.readouterr().err


async def test_cli_exits_zero_when_a_sync_handler_ignores_cancellation(fake):
    proc = await _spawn("tests.worker.cli_app:worker", "--target", fake.target,
                        "--queues", "q", "--drain-grace", "0.3")
    try:
        await fake.wait_for(lambda: fake.open_streams == 1, timeout_s=20)
        lease = await fake.push("hang")
        await fake.wait_for(lambda: any(lease in h.lease_ids for h in fake.heartbeats))
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(proc.wait(), 20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    output = (await proc.stdout.read()).decode()
    assert rc == 0, output
    assert fake.failed()[lease].mode == dtq_pb2.FAIL_MODE_RELEASE
    assert "still running" in output


async def test_cli_exits_1_when_the_gateway_refuses_the_worker(fake):
    import grpc

    fake.lease_error = (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED")
    proc = await _spawn("tests.worker.cli_app:worker", "--target", fake.target)
    rc = await asyncio.wait_for(proc.wait(), 20)
    output = (await proc.stdout.read()).decode()
    assert rc == 1, output
    assert "refused" in output and len(fake.lease_requests) == 1


async def test_cli_exits_1_with_a_clear_message_on_an_invalid_lease_request(fake):
    """INVALID_ARGUMENT at Lease is the worker's configuration (e.g. labels past the
    gateway's bounds): exit 1 at once, no reconnect, naming the field and saying so."""
    import grpc

    fake.lease_error = (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT",
                        "labels: at most 32 entries", "labels")
    proc = await _spawn("tests.worker.cli_app:worker", "--target", fake.target)
    rc = await asyncio.wait_for(proc.wait(), 20)
    output = (await proc.stdout.read()).decode()
    assert rc == 1, output
    assert len(fake.lease_requests) == 1, "it reconnected"
    assert "refused its Lease request as invalid (field labels)" in output, output
    assert "labels: at most 32 entries" in output and "configuration error" in output


def test_cli_flags_from_env(monkeypatch):
    from dtq_pyworker.cli import apply_flags, build_parser
    from dtq_pyworker.worker import Worker

    for name, value in {"DTQ_MAX_IN_FLIGHT": "7", "DTQ_WORKER_ID": "env-w",
                        "DTQ_DRAIN_GRACE_MS": "1500", "DTQ_ACK_FLUSH_MS": "2",
                        "DTQ_CONCURRENCY": "3", "DTQ_QUEUES": "x, y"}.items():
        monkeypatch.setenv(name, value)
    worker = Worker(["q"], "h:1")
    apply_flags(worker, build_parser().parse_args(["m:w"]))
    assert (worker.max_in_flight, worker.worker_id, worker.drain_grace_s) == (7, "env-w", 1.5)
    assert (worker.ack_flush_ms, worker.concurrency, worker.queues) == (2, 3, ["x", "y"])


def test_cli_takes_dtq_queue_when_dtq_queues_is_unset(monkeypatch):
    from dtq_pyworker.cli import apply_flags, build_parser
    from dtq_pyworker.worker import Worker

    monkeypatch.delenv("DTQ_QUEUES", raising=False)
    monkeypatch.setenv("DTQ_QUEUE", "solo")
    worker = Worker(["q"], "h:1")
    apply_flags(worker, build_parser().parse_args(["m:w"]))
    assert worker.queues == ["solo"]
    monkeypatch.setenv("DTQ_QUEUES", "a,b")  # the plural wins
    apply_flags(worker, build_parser().parse_args(["m:w"]))
    assert worker.queues == ["a", "b"]


async def test_sigtermed_worker_hands_long_sync_handlers_tasks_back(gateway):
    """A SIGTERMed dtq-pyworker whose sync handlers outlive the drain grace hands their
    tasks back (FAIL_MODE_RELEASE): they are QUEUED again at once with no attempt
    spent, not left for the visibility timeout, and the log says so."""
    from dtq_pyworker import AsyncClient

    target = f"127.0.0.1:{gateway.port}"
    async with AsyncClient(target) as client:
        ids = [(await client.enqueue("hangq", "hang", {})).task_id for _ in range(2)]
        proc = await _spawn("tests.worker.cli_app:worker", "--target", target,
                            "--queues", "hangq", "--concurrency", "2", "--drain-grace", "0.5")
        try:
            deadline = asyncio.get_running_loop().time() + 30
            while [(await client.get_task(t)).status for t in ids] != [
                    dtq_pb2.TASK_STATUS_ACTIVE] * 2:
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            rc = await asyncio.wait_for(proc.wait(), 30)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        tasks = [await client.get_task(t) for t in ids]
    output = (await proc.stdout.read()).decode()
    assert rc == 0, output
    assert [t.status for t in tasks] == [dtq_pb2.TASK_STATUS_QUEUED] * 2, output
    assert [t.attempt for t in tasks] == [1, 1]
    assert "handing 2 running task(s) back" in output
    assert "2 sync handler thread(s) still running" in output and "2 released" in output
