"""dtq-gateway's shutdown watchdog: it ends a stop that outlasts its bound, only then."""

from __future__ import annotations

import logging
import threading

from dtq_gateway.cli import Watchdog


def test_watchdog_exits_1_once_the_bound_has_passed(caplog) -> None:
    exited = threading.Event()
    codes: list[int] = []
    dog = Watchdog(0.2, exit_=lambda code: (codes.append(code), exited.set()))
    with caplog.at_level(logging.ERROR, logger="dtq_gateway"):
        dog.arm()
        assert exited.wait(timeout=30)
    assert codes == [1]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        "shutdown did not finish within 0.2 s; exiting now"]


def test_watchdog_disarmed_in_time_does_nothing() -> None:
    codes: list[int] = []
    dog = Watchdog(0.3, exit_=codes.append)
    dog.arm()
    dog.disarm()
    assert dog._timer is not None
    dog._timer.join(timeout=30)  # a cancelled timer's thread ends without firing
    assert codes == []


def test_watchdog_not_armed_never_fires() -> None:
    codes: list[int] = []
    Watchdog(0.01, exit_=codes.append).disarm()
    assert codes == []
