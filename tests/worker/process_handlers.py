"""Module-level handlers for the ``pool="process"`` tests (children import them by name)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time


def echo(payload, ctx):
    """Return the payload and the pid of the process that ran it."""
    return {"payload": payload, "pid": os.getpid(), "attempt": ctx.attempt}


def c_sleep(payload, ctx):
    """Block in C (libc ``sleep``) for ``payload["s"]`` seconds: no Python code runs, so
    neither a thread-pool timeout nor ``ctx.cancelled`` can stop it."""
    ctypes.CDLL(ctypes.util.find_library("c")).sleep(int(payload["s"]))
    return {"slept": payload["s"]}


def abort(payload, ctx):
    """Kill its own process with SIGABRT."""
    os.abort()


def progress(payload, ctx):
    """Report progress, then wait (bounded) until the test saw it."""
    ctx.progress(42.0, "half way")
    time.sleep(payload.get("hold_s", 0))
    return {"pid": os.getpid()}


def polite(payload, ctx):
    """Return as soon as ``ctx.cancelled`` is set (within 30 s)."""
    return {"cancelled_seen": ctx.cancelled.wait(30)}
