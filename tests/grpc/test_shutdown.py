"""Graceful gateway shutdown: Lease streams end UNAVAILABLE, unary calls finish, quick exit."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from dtq_gateway.server import STOP_MARGIN_S, Gateway
from dtq_proto import dtq_pb2_grpc
from tests.conftest import gateway_settings
from tests.support.leasing import LeaseStream
from tests.support.redis_server import free_port


async def test_stop_ends_lease_streams_with_unavailable(redis_url):
    gw = Gateway(gateway_settings(redis_url), redis_url)
    await gw.start()
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}")
    broker = dtq_pb2_grpc.BrokerStub(ch)
    lease = await LeaseStream(broker, "w1", ["q"]).open()
    started = time.monotonic()
    await gw.stop()
    assert time.monotonic() - started < gw.settings.shutdown_grace_s + 1
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await lease.next(timeout_s=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    await ch.close()


def test_sigterm_exits_zero_within_grace(redis_url):
    port = free_port()
    env = dict(os.environ, DTQ_REDIS_URL=redis_url, DTQ_LISTEN=f"127.0.0.1:{port}",
               DTQ_METRICS_PORT="0", DTQ_SHUTDOWN_GRACE_S="2")
    proc = subprocess.Popen([sys.executable, "-m", "dtq_gateway"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            grpc.channel_ready_future(ch).result(timeout=15)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - started < 2 + 1
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_a_taken_port_is_refused_not_shared(redis_url):
    port = free_port()
    env = dict(os.environ, DTQ_REDIS_URL=redis_url, DTQ_LISTEN=f"127.0.0.1:{port}",
               DTQ_METRICS_PORT="0")
    first = subprocess.Popen([sys.executable, "-m", "dtq_gateway"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            grpc.channel_ready_future(ch).result(timeout=15)
        second = subprocess.run([sys.executable, "-m", "dtq_gateway"], env=env, check=False,
                                capture_output=True, text=True, timeout=30)
        assert second.returncode == 1
        assert "gateway failed" in second.stderr
    finally:
        first.terminate()
        first.wait(timeout=10)


def _held_listener() -> tuple[socket.socket, int]:
    """A socket listening on 127.0.0.1:<free port> (what an unrelated program holds)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock, sock.getsockname()[1]


def _records(stderr: str) -> list[dict]:
    """The gateway's stderr as JSON log records; any other line (a traceback, grpc's
    own error line) fails the test."""
    records = []
    for line in stderr.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            pytest.fail(f"stderr line is not a log record: {line!r}\n{stderr}")
    return records


@pytest.mark.parametrize("listener", ["gRPC", "metrics", "dashboard"])
def test_a_listener_that_cannot_bind_stops_the_gateway_with_one_line(redis_url, listener):
    held, port = _held_listener()
    env = dict(os.environ, DTQ_REDIS_URL=redis_url, DTQ_LISTEN=f"127.0.0.1:{free_port()}",
               DTQ_METRICS_PORT="0", DTQ_LOG_FORMAT="json")
    env.update({"gRPC": {"DTQ_LISTEN": f"127.0.0.1:{port}"},
                "metrics": {"DTQ_METRICS_PORT": str(port)},
                "dashboard": {"DTQ_DASHBOARD_PORT": str(port)}}[listener])
    try:
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "dtq_gateway"], env=env, check=False,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              timeout=60)
        elapsed = time.monotonic() - started
    finally:
        held.close()
    assert proc.returncode == 1, proc.stderr
    assert elapsed < 30  # at once: never waits for a signal
    errors = [r for r in _records(proc.stderr) if r["level"] in ("ERROR", "CRITICAL")]
    expected = (f"gateway failed: {listener} cannot listen on 127.0.0.1:{port}: "
                "Address already in use")
    assert [r["message"] for r in errors] == [expected]


def test_sigterm_while_starting_against_an_unanswering_redis_ends_within_grace():
    """Redis accepts the connection and never answers: the start waits on socket
    timeouts (5 s each), and SIGTERM must still end the gateway within its grace."""
    black_hole, port = _held_listener()
    black_hole.settimeout(30)
    grace_s = 1.0
    env = dict(os.environ, DTQ_REDIS_URL=f"redis://127.0.0.1:{port}/0",
               DTQ_LISTEN=f"127.0.0.1:{free_port()}", DTQ_METRICS_PORT="0",
               DTQ_SHUTDOWN_GRACE_S=str(grace_s), DTQ_LOG_FORMAT="json")
    proc = subprocess.Popen([sys.executable, "-m", "dtq_gateway"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    held = []
    try:
        held.append(black_hole.accept()[0])  # the start's first Redis call is waiting
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("SIGTERM ignored while starting")
        elapsed = time.monotonic() - started
        assert rc == 0, proc.stderr.read()
        assert elapsed < grace_s + STOP_MARGIN_S, elapsed
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for conn in held:
            conn.close()
        black_hole.close()


def test_ctrl_c_reaches_the_gateway_alone_which_then_stops_its_embedded_redis(tmp_path):
    """Ctrl-C signals the terminal's whole process group: the embedded redis-server is in
    a group of its own, so the gateway drains against a live Redis (it releases the
    scheduler lock, nothing complains) and then stops the server."""
    port = free_port()
    env = dict(os.environ, DTQ_LISTEN=f"127.0.0.1:{port}", DTQ_METRICS_PORT="0",
               DTQ_EMBEDDED_DIR=str(tmp_path / "redis"), DTQ_SHUTDOWN_GRACE_S="2",
               DTQ_LOG_FORMAT="json")
    env.pop("DTQ_REDIS_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "dtq_gateway"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    redis_pid = 0
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            grpc.channel_ready_future(ch).result(timeout=60)
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert len(children) == 1
        redis_pid = int(children[0])
        assert os.getpgid(redis_pid) != os.getpgid(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        started = time.monotonic()
        assert proc.wait(timeout=60) == 0
        assert time.monotonic() - started < 2 + STOP_MARGIN_S
        records = _records(proc.stderr.read())
        assert [r for r in records if r["level"] != "INFO"] == []
        assert records[-1]["message"] == "stopped"
        with pytest.raises(ProcessLookupError):  # the gateway stopped (and reaped) it
            os.kill(redis_pid, 0)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if redis_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(redis_pid, signal.SIGKILL)


async def test_a_signal_that_came_while_the_loop_started_stops_the_gateway(redis_url,
                                                                          monkeypatch):
    """A SIGTERM between the embedded Redis start and the event loop taking the signals
    over is noted (not raised inside the loop, where it could be lost) and acted on as
    soon as the loop runs: the gateway stops instead of serving on."""
    import signal as signal_mod

    from dtq_gateway import cli
    from tests.conftest import gateway_settings

    monkeypatch.setattr(cli, "_NOTED", [signal_mod.SIGTERM])
    exits: list[int] = []
    saved = {sig: signal_mod.getsignal(sig) for sig in cli.STOP_SIGNALS}
    try:
        await asyncio.wait_for(cli._serve(gateway_settings(redis_url), redis_url,
                                          cli.Watchdog(60, exit_=exits.append)), 30)
    finally:
        for sig, handler in saved.items():
            signal_mod.signal(sig, handler)
    assert exits == []


def test_sigterm_while_the_gateway_loads_its_modules_exits_zero():
    """A SIGTERM as soon as dtq's code runs (settings being read, the gRPC stack still
    to be imported) is noted, not left to the default action (killed by the signal)."""
    code = (
        "import os, signal, sys\n"
        "from dtq_gateway import cli\n"
        "real = cli.load\n"
        "def load(argv):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return real(argv)\n"
        "cli.load = load\n"
        "sys.exit(cli.main([]))\n")
    env = dict(os.environ, DTQ_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
               DTQ_LISTEN=f"127.0.0.1:{free_port()}", DTQ_METRICS_PORT="0",
               DTQ_LOG_FORMAT="json")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert [r["message"] for r in _records(proc.stderr)] == ["stopped while starting"]
