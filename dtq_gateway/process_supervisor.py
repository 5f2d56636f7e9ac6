"""``dtq-gateway --processes N``: N gateway processes on one listen address.

One gateway process is one Python event loop: it uses one core. To use every core of a
host, the supervisor (this module, the parent process) starts N gateway processes, each
a plain ``dtq-gateway`` with DTQ_LISTEN_REUSEPORT on, so all of them bind DTQ_LISTEN and
the kernel spreads new client connections over them (SO_REUSEPORT). The parent serves
nothing itself; it:

- checks before anything starts that DTQ_LISTEN, the metrics ports and the dashboard
  port are free (a port another program holds: one ERROR line, exit 1);
- starts the embedded redis-server once when DTQ_REDIS_URL is empty, and gives all
  processes its URL;
- restarts a process that exits on its own, after a backoff that doubles from
  RESTART_MIN_S to RESTART_MAX_S (reset once a process has lived RESTART_RESET_S),
  logging each exit and restart;
- on SIGTERM/SIGINT, sends SIGTERM to every process (each drains as one gateway does)
  and exits once all have: 0 when all exited 0, 1 otherwise or when one outlasted
  DTQ_SHUTDOWN_GRACE_S + the gateway's STOP_MARGIN_S + KILL_MARGIN_S (it is then
  SIGKILLed).

Process i (0-based) runs with gateway id ``<DTQ_GATEWAY_ID>-i``, Prometheus metrics on
DTQ_METRICS_PORT + i (0 stays off) and, for i = 0 only, the dashboard. Each process
gets SIGTERM when the supervisor dies (PR_SET_PDEATHSIG), so none outlives it.
Leader duties need nothing here: every process elects through Redis like any replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence

from dtq_gateway.listen import ListenError, check_free
from dtq_gateway.settings import MAX_GATEWAY_PROCESSES, Settings
from dtq_gateway.store.embedded import with_parent_death

log = logging.getLogger(__name__)

#: First restart delay after a process exits (s); doubles per quick exit.
RESTART_MIN_S = 0.5
#: Longest restart delay (s).
RESTART_MAX_S = 30.0
#: A process that lived this long restarts after RESTART_MIN_S again (s).
RESTART_RESET_S = 30.0
#: Seconds past a process's own stop bound before the supervisor SIGKILLs it.
KILL_MARGIN_S = 5.0
#: Exit status of ``dtq-gateway`` on bad settings: the supervisor then gives up at once.
BAD_SETTINGS = 2


def process_count(settings: Settings) -> int:
    """DTQ_GATEWAY_PROCESSES resolved: 0 means one per CPU core (1..MAX_GATEWAY_PROCESSES)."""
    return settings.gateway_processes or min(max(1, os.cpu_count() or 1), MAX_GATEWAY_PROCESSES)


def child_args(argv: Sequence[str], settings: Settings, index: int,
               redis_url: str | None) -> list[str]:
    """Command line of gateway process ``index``: the supervisor's own flags, then
    flags that override them (argparse keeps the last value of a repeated flag).

    Args:
        argv: the flags ``dtq-gateway`` was given.
        settings: the supervisor's settings.
        index: 0-based process number.
        redis_url: the embedded redis-server's URL, or None to keep DTQ_REDIS_URL.
    """
    extra = ["--gateway-processes", "1", "--listen-reuseport", "true",
             "--gateway-id", f"{settings.gateway_id}-{index}",
             "--metrics-port", str(settings.metrics_port + index if settings.metrics_port else 0),
             "--dashboard-port", str(settings.dashboard_port if index == 0 else 0)]
    if redis_url is not None:
        extra += ["--redis-url", redis_url]
    return [sys.executable, "-m", "dtq_gateway", *argv, *extra]


def check_ports(settings: Settings, count: int) -> None:
    """Raise ListenError when an address some process needs is taken now: DTQ_LISTEN,
    DTQ_METRICS_PORT .. + count - 1, DTQ_DASHBOARD_PORT."""
    check_free("gRPC", settings.listen)
    host = settings.metrics_host or settings.listen.rpartition(":")[0]
    if settings.metrics_port:
        last = settings.metrics_port + count - 1
        if last > 65535:
            raise ListenError("metrics", f"{host}:{last}", "port number out of range")
        for i in range(count):
            check_free("metrics", f"{host}:{settings.metrics_port + i}")
    if settings.dashboard_port:
        check_free("dashboard", f"{settings.dashboard_host}:{settings.dashboard_port}")


class Supervisor:
    """Runs and restarts the gateway processes until a stop signal.

    Args:
        settings: the supervisor's settings (DTQ_GATEWAY_PROCESSES != 1).
        argv: the flags ``dtq-gateway`` was given (passed on to every process).
        redis_url: the embedded redis-server's URL, or None (DTQ_REDIS_URL is set).
        stop_limit_s: how long one process's stop may take (s): DTQ_SHUTDOWN_GRACE_S +
            the gateway's stop margin; KILL_MARGIN_S later it is SIGKILLed.
    """

    def __init__(self, settings: Settings, argv: Sequence[str], redis_url: str | None,
                 stop_limit_s: float) -> None:
        self.settings = settings
        self.stop_limit_s = stop_limit_s
        self.argv = list(argv)
        self.redis_url = redis_url
        self.count = process_count(settings)
        self.stop = asyncio.Event()
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        #: exit status of the supervisor: 1 after a failed stop, 2 after refused settings
        self.status = 0

    async def _spawn(self, index: int) -> asyncio.subprocess.Process:
        args, extra = with_parent_death(
            child_args(self.argv, self.settings, index, self.redis_url))
        proc = await asyncio.create_subprocess_exec(*args, **extra)
        self.procs[index] = proc
        if self.stop.is_set():  # the stop came while it started: _forward_stop missed it
            proc.send_signal(signal.SIGTERM)
        log.info("gateway process started", extra={
            "index": index, "pid": proc.pid, "gateway_id": f"{self.settings.gateway_id}-{index}"})
        return proc

    async def _keep(self, index: int) -> None:
        """Run process ``index``; restart it with backoff until the stop signal."""
        delay = RESTART_MIN_S
        while not self.stop.is_set():
            started = time.monotonic()
            proc = await self._spawn(index)
            code = await proc.wait()
            if self.stop.is_set():
                if code != 0:
                    self.status = self.status or 1
                return
            if code == BAD_SETTINGS:
                log.error("gateway process refused its settings; stopping all",
                          extra={"index": index})
                self.status = BAD_SETTINGS
                self.stop.set()
                return
            if time.monotonic() - started >= RESTART_RESET_S:
                delay = RESTART_MIN_S
            log.warning("gateway process exited; restarting", extra={
                "index": index, "pid": proc.pid, "returncode": code, "restart_in_s": delay})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), timeout=delay)
            delay = min(delay * 2, RESTART_MAX_S)

    async def _forward_stop(self) -> None:
        """On the stop signal: SIGTERM every process; SIGKILL those past their bound."""
        await self.stop.wait()
        log.info("stopping gateway processes", extra={"processes": len(self.procs)})
        for proc in self.procs.values():
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        limit_s = self.stop_limit_s + KILL_MARGIN_S
        waits = [asyncio.ensure_future(p.wait()) for p in self.procs.values()]
        if waits:
            _, late = await asyncio.wait(waits, timeout=limit_s)
            if late:
                self.status = self.status or 1
                log.error("gateway processes outlasted %.1f s; killing them", limit_s)
                for proc in self.procs.values():
                    if proc.returncode is None:
                        with contextlib.suppress(ProcessLookupError):
                            proc.kill()

    async def run(self, noted: Sequence[int] = ()) -> int:
        """Serve until SIGTERM/SIGINT; the exit status (see :func:`supervise`).

        Args:
            noted: stop signals that arrived before the event loop took them over
                (any: stop at once).
        """
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        if noted:
            return 0
        log.info("supervising gateway processes", extra={
            "processes": self.count, "listen": self.settings.listen})
        stopper = asyncio.ensure_future(self._forward_stop())
        await asyncio.gather(*(self._keep(i) for i in range(self.count)))
        self.stop.set()
        await stopper
        log.info("stopped", extra={"exit_status": self.status})
        return self.status


def supervise(settings: Settings, argv: Sequence[str], redis_url: str | None,
              stop_limit_s: float, noted: Sequence[int] = ()) -> int:
    """Run the gateway processes until SIGTERM/SIGINT (``dtq-gateway`` when
    DTQ_GATEWAY_PROCESSES != 1, after :func:`check_ports` and the embedded Redis).

    Args:
        settings: the supervisor's settings.
        argv: the flags ``dtq-gateway`` was given.
        redis_url: the embedded redis-server's URL, or None (DTQ_REDIS_URL is set).
        stop_limit_s: how long one process's stop may take (s), see :class:`Supervisor`.
        noted: stop signals that arrived before the event loop started.

    Returns:
        0 after SIGTERM/SIGINT when every process drained and exited 0; 1 when one did
        not stop in time or exited non-zero on the stop; 2 when one refused its settings.
    """
    return asyncio.run(Supervisor(settings, argv, redis_url, stop_limit_s).run(noted))
