"""``dtq-gateway --processes N``: settings and the command line of each gateway process.

The processes themselves (restart, drain, a taken port, one leader) are exercised in
tests/system/test_gateway_processes.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import time
from pathlib import Path

import pytest

from dtq_gateway import process_supervisor as supervisor
from dtq_gateway.listen import ListenError, check_free
from dtq_gateway.settings import SettingsError, load


def test_processes_flag_env_and_default() -> None:
    assert load([], environ={}).gateway_processes == 1
    assert load(["--processes", "4"], environ={}).gateway_processes == 4
    assert load([], environ={"DTQ_GATEWAY_PROCESSES": "3"}).gateway_processes == 3
    assert load(["--gateway-processes", "2"], environ={}).gateway_processes == 2


@pytest.mark.parametrize("argv, needle", [
    (["--processes", "-1"], "DTQ_GATEWAY_PROCESSES must be >= 0"),
    (["--processes", "2", "--listen", "127.0.0.1:0"], "needs a fixed port in DTQ_LISTEN"),
    (["--processes", "many"], "--gateway-processes: expected a number"),
    (["--processes", "100000", "--metrics-port", "0"], "DTQ_GATEWAY_PROCESSES must be at most 256"),
    (["--processes", "257", "--metrics-port", "0"], "DTQ_GATEWAY_PROCESSES must be at most 256"),
])
def test_bad_process_settings_name_the_variable(argv: list[str], needle: str) -> None:
    with pytest.raises(SettingsError, match=needle):
        load(argv, environ={})


def test_zero_processes_means_one_per_core() -> None:
    settings = load(["--processes", "0"], environ={})
    assert supervisor.process_count(settings) == (os.cpu_count() or 1)


def test_one_per_core_is_capped_like_an_explicit_count(monkeypatch) -> None:
    monkeypatch.setattr(supervisor.os, "cpu_count", lambda: 1000)
    settings = load(["--processes", "0", "--metrics-port", "0"], environ={})
    assert supervisor.process_count(settings) == 256


def test_each_process_gets_its_id_metrics_port_and_only_the_first_the_dashboard() -> None:
    argv = ["--processes", "3", "--metrics-port", "9500", "--dashboard-port", "8080",
            "--gateway-id", "gw"]
    settings = load(argv, environ={})
    for index in range(3):
        child = load(supervisor.child_args(argv, settings, index, None)[3:], environ={})
        assert child.gateway_processes == 1 and child.listen_reuseport is True
        assert child.gateway_id == f"gw-{index}"
        assert child.metrics_port == 9500 + index
        assert child.dashboard_port == (8080 if index == 0 else 0)
        assert child.redis_url == ""  # DTQ_REDIS_URL (the environment) is kept


def test_child_args_run_this_python_and_pass_the_embedded_redis_url() -> None:
    settings = load(["--processes", "2", "--metrics-port", "0"], environ={})
    args = supervisor.child_args(["--processes", "2"], settings, 1, "redis://127.0.0.1:7000")
    assert args[:3] == [sys.executable, "-m", "dtq_gateway"]
    child = load(args[3:], environ={})
    assert child.redis_url == "redis://127.0.0.1:7000"
    assert child.metrics_port == 0  # metrics off stays off in every process


def test_check_free_with_reuseport_shares_only_with_reuseport_holders() -> None:
    with socket.socket() as sibling:
        sibling.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sibling.bind(("127.0.0.1", 0))
        sibling.listen()
        address = f"127.0.0.1:{sibling.getsockname()[1]}"
        check_free("gRPC", address, reuseport=True)  # a sibling process: shared
        with pytest.raises(ListenError, match="Address already in use"):
            check_free("gRPC", address)
    with socket.socket() as other:  # another program, without SO_REUSEPORT
        other.bind(("127.0.0.1", 0))
        other.listen()
        with pytest.raises(ListenError, match="Address already in use"):
            check_free("gRPC", f"127.0.0.1:{other.getsockname()[1]}", reuseport=True)


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_a_taken_metrics_port_of_any_process_is_refused_before_anything_starts() -> None:
    for _ in range(50):  # the two ports below the taken one must be free (shared machine)
        with socket.socket() as other:
            other.bind(("127.0.0.1", 0))
            other.listen()
            taken = other.getsockname()[1]
            if not (_free(taken - 2) and _free(taken - 1)):
                continue
            settings = load(["--processes", "3", "--listen", "127.0.0.1:1",
                             "--metrics-port", str(taken - 2)], environ={})
            with pytest.raises(ListenError,
                               match=f"metrics cannot listen on 127.0.0.1:{taken}"):
                supervisor.check_ports(settings, 3)
            return
    pytest.fail("found no three consecutive ports to test with")


# -- the supervisor loop, with stand-in children (python -c ...) ---------------------------
def stand_in(monkeypatch: pytest.MonkeyPatch, code: str) -> None:
    """Every gateway process the supervisor starts runs ``python -c code`` instead."""
    monkeypatch.setattr(supervisor, "child_args",
                        lambda argv, settings, index, url: [sys.executable, "-c", code])


def run_supervisor(settings, limit_s: float = 20.0, stop_after=None) -> int:
    """Run a Supervisor of ``settings``; ``stop_after(sup)`` is awaited, then stop is set."""
    async def main() -> int:
        sup = supervisor.Supervisor(settings, [], None, stop_limit_s=0.1)
        running = asyncio.ensure_future(sup.run())
        if stop_after is not None:
            await stop_after(sup)
            sup.stop.set()
        return await asyncio.wait_for(running, limit_s)
    return asyncio.run(main())


def test_a_process_that_refuses_its_settings_stops_all_with_status_2(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in(monkeypatch, "import sys; sys.exit(2)")
    assert run_supervisor(load(["--processes", "2", "--listen", "127.0.0.1:1"],
                               environ={})) == 2


def test_restart_delay_doubles_while_a_process_keeps_exiting(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    stand_in(monkeypatch, "pass")  # exits 0 at once, again and again
    monkeypatch.setattr(supervisor, "RESTART_MIN_S", 0.05)
    monkeypatch.setattr(supervisor, "RESTART_MAX_S", 0.2)

    async def four_restarts(sup: supervisor.Supervisor) -> None:
        deadline = time.monotonic() + 15
        while len(restarts()) < 5 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # polling the log with a deadline

    def restarts() -> list[float]:
        return [r.restart_in_s for r in caplog.records
                if r.getMessage() == "gateway process exited; restarting"]
    caplog.set_level(logging.INFO, logger="dtq_gateway.process_supervisor")
    status = run_supervisor(load(["--processes", "1", "--listen", "127.0.0.1:1"],
                                 environ={}), stop_after=four_restarts)
    assert status == 0
    assert restarts()[:5] == [0.05, 0.1, 0.2, 0.2, 0.2]


def test_a_process_that_ignores_sigterm_is_killed_after_its_bound(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    stand_in(monkeypatch, "import pathlib, signal, time; signal.signal(15, signal.SIG_IGN); "
                          f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)")
    monkeypatch.setattr(supervisor, "KILL_MARGIN_S", 0.2)

    async def when_ready(sup: supervisor.Supervisor) -> None:
        deadline = time.monotonic() + 15
        while not ready.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # polling for the child's ready file with a deadline
        assert ready.exists()
    started = time.monotonic()
    assert run_supervisor(load(["--processes", "1", "--listen", "127.0.0.1:1"], environ={}),
                          stop_after=when_ready) == 1
    assert time.monotonic() - started < 10  # killed, not waited out (60 s)
