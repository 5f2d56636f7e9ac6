"""``dtq-gateway``: run one gateway replica (``--processes N``: N of them, supervised).

Settings come from ``DTQ_*`` environment variables and flags (``--help``). With no
DTQ_REDIS_URL an embedded redis-server is started, which the first log line says.
Exit status: 0 after SIGTERM/SIGINT (whatever the gateway was doing: starting the
embedded Redis, starting, serving), 2 on bad settings, 1 on errors (one ERROR line
names it, e.g. ``gateway failed: dashboard cannot listen on 127.0.0.1:8080: Address
already in use``) and when a stop outlasts DTQ_SHUTDOWN_GRACE_S + 5 s. With
DTQ_GATEWAY_PROCESSES != 1 this process supervises that many gateway processes
(:mod:`dtq_gateway.process_supervisor`, whose exit statuses it returns).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from dtq_gateway import logconf
from dtq_gateway.settings import SettingsError, load

log = logging.getLogger("dtq_gateway")

#: The signals that stop the gateway.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequested(Exception):
    """SIGTERM or SIGINT arrived before the event loop took the signals over (while
    the embedded redis-server starts)."""


def _raise_stop(signum: int, frame: object) -> None:
    raise StopRequested(signal.Signals(signum).name)


#: Stop signals that arrived between the embedded Redis start and the event loop
#: taking the signals over (:func:`_note_stop`); :func:`_serve` acts on them at once.
_NOTED: list[int] = []


def _note_stop(signum: int, frame: object) -> None:
    """Record a stop signal instead of raising: an exception raised by a signal handler
    inside the event loop's own code (uvloop runs C callbacks) could be swallowed there,
    and the signal lost."""
    _NOTED.append(signum)


def _ignore_repeat(signum: int, frame: object) -> None:
    log.info("already stopping", extra={"signal": signal.Signals(signum).name})


class Watchdog:
    """Ends the process when an orderly stop outlasts its bound.

    Armed once stopping starts (a signal, a failed start); a daemon thread then logs
    one line and calls ``os._exit(1)`` after ``limit_s`` unless :meth:`disarm` came
    first. The embedded redis-server ends with the process (it runs with PDEATHSIG).

    Args:
        limit_s: how long the stop may take (s): DTQ_SHUTDOWN_GRACE_S + STOP_MARGIN_S.
        exit_: what ends the process (``os._exit``; tests pass another).
    """

    def __init__(self, limit_s: float, exit_: Callable[[int], object] = os._exit) -> None:
        self.limit_s = limit_s
        self._exit = exit_
        self._timer: threading.Timer | None = None

    def arm(self) -> None:
        """Start counting (a second call changes nothing)."""
        if self._timer is None:
            self._timer = threading.Timer(self.limit_s, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def disarm(self) -> None:
        """The stop finished in time."""
        if self._timer is not None:
            self._timer.cancel()

    def _expire(self) -> None:
        log.error("shutdown did not finish within %.1f s; exiting now", self.limit_s)
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):  # a closed stream must not stop the exit
                handler.flush()
        self._exit(1)


async def _serve(settings, redis_url: str, watchdog: Watchdog) -> None:
    """Run one gateway until SIGTERM/SIGINT; a signal during the start cancels it.

    Raises:
        ListenError, EvictionPolicyError, OSError: the start failed (the gateway has
            already stopped what it had started).
    """
    from dtq_gateway.server import Gateway

    gateway = Gateway(settings, redis_url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    if _NOTED:  # a signal came while the loop started: stop at once
        stop.set()
    starting = asyncio.create_task(gateway.start(), name="dtq-start")
    stopping = asyncio.create_task(stop.wait(), name="dtq-stop-signal")
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if starting.done():
            starting.result()  # a failed start raises here, having stopped what it began
            await stopping
        log.info("shutting down", extra={"grace_s": settings.shutdown_grace_s})
        watchdog.arm()
        if not starting.done():  # a signal while starting: start() stops what it began
            gateway.abort_start()
            # a cancel that lands inside redis-py while it connects can be swallowed
            # (the read then runs to its 5 s socket timeout): cancel again until the
            # start gives up and its stop() runs (which is not cancelled)
            while not starting.done() and not gateway.stopping:
                starting.cancel()
                await asyncio.wait({starting}, timeout=0.25)
            await asyncio.wait({starting})
            return
        await gateway.stop()
    finally:
        stopping.cancel()
        for sig in STOP_SIGNALS:  # a repeated signal while the loop closes: no traceback
            loop.remove_signal_handler(sig)
            signal.signal(sig, _ignore_repeat)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dtq-gateway`` console script.

    Returns:
        0 after SIGTERM/SIGINT (in any state: starting the embedded Redis, starting,
        serving), 1 when the gateway could not serve (one ERROR line says why: a
        listener that cannot bind, the embedded Redis, the eviction policy) or its stop
        outlasted DTQ_SHUTDOWN_GRACE_S + STOP_MARGIN_S, 2 on bad settings.
    """
    for sig in STOP_SIGNALS:  # first of all: a signal during the imports is noted
        signal.signal(sig, _note_stop)
    try:
        settings = load(sys.argv[1:] if argv is None else argv)
    except SettingsError as exc:
        print(f"dtq-gateway: {exc}", file=sys.stderr)
        return 2
    logconf.configure(settings.log_level, settings.log_format)
    from dtq_gateway.server import STOP_MARGIN_S

    watchdog = Watchdog(settings.shutdown_grace_s + STOP_MARGIN_S)
    if _NOTED:
        log.info("stopped while starting", extra={"signal": signal.Signals(_NOTED[0]).name})
        return 0
    for sig in STOP_SIGNALS:  # until the event loop takes them over
        signal.signal(sig, _raise_stop)
    embedded_box: list = []
    try:
        args = list(sys.argv[1:] if argv is None else argv)
        return _run(settings, watchdog, embedded_box, args)
    except StopRequested as exc:
        log.info("stopped while starting", extra={"signal": str(exc)})
        return 0
    finally:
        for sig in STOP_SIGNALS:
            signal.signal(sig, _ignore_repeat)
        if embedded_box:
            watchdog.arm()
            embedded_box[0].stop()
        watchdog.disarm()


def _run(settings, watchdog: Watchdog, embedded_box: list, argv: list[str]) -> int:
    """Start the embedded Redis when needed (appended to ``embedded_box`` for
    :func:`main` to stop), then serve, or supervise DTQ_GATEWAY_PROCESSES gateway
    processes (:mod:`dtq_gateway.process_supervisor`); return the exit status."""
    from dtq_gateway.listen import ListenError
    from dtq_gateway.store.redis_policy import EvictionPolicyError

    if settings.gateway_processes != 1:
        from dtq_gateway import process_supervisor as supervisor

        try:  # before the embedded Redis: a taken port is the whole answer
            supervisor.check_ports(settings, supervisor.process_count(settings))
        except ListenError as exc:
            log.error("gateway failed: %s", exc)
            return 1
    redis_url = settings.redis_url
    if not redis_url:
        from dtq_gateway.store.embedded import EmbeddedRedis, EmbeddedRedisError

        try:
            embedded = EmbeddedRedis(settings.embedded_dir)
            embedded_box.append(embedded)
            log.info("no DTQ_REDIS_URL: starting embedded redis-server with AOF",
                     extra={"binary": embedded.binary, "dir": str(embedded.dir),
                            "url": embedded.url})
            embedded.start()
        except (EmbeddedRedisError, OSError) as exc:
            log.error("embedded redis failed: %s", exc)
            return 1
        redis_url = embedded.url
    else:
        log.info("using redis from DTQ_REDIS_URL", extra={"settings": repr(settings)})
    try:
        import uvloop

        runner: Callable[..., Any] = uvloop.run
    except ImportError:
        runner = asyncio.run
    for sig in STOP_SIGNALS:  # from here on the loop handles them (see _note_stop)
        signal.signal(sig, _note_stop)
    if settings.gateway_processes != 1:
        return supervisor.supervise(settings, argv, redis_url if embedded_box else None,
                                    watchdog.limit_s, _NOTED)
    try:
        runner(_serve(settings, redis_url, watchdog))
    except ListenError as exc:
        log.error("gateway failed: %s", exc)
        return 1
    except OSError as exc:
        log.error("gateway failed: %s (gRPC %s, metrics port %s)", exc, settings.listen,
                  settings.metrics_port or "off")
        return 1
    except EvictionPolicyError as exc:
        log.error("gateway refused to start: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
