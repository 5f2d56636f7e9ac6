"""Module-level handlers for the ``pool="process"`` tests (children import them by name)."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import time

from dtq_pyworker import PermanentError, Retry


def echo(payload, ctx):
    """Return the payload, the pid of the process that ran it and when (epoch s)."""
    return {"payload": payload, "pid": os.getpid(), "ran_at": time.time()}


def c_sleep(payload, ctx):
    """Report its pid as progress, then block in C (libc ``sleep``) for ``payload["s"]``
    seconds: no Python code runs, so neither a thread-pool timeout nor
    ``ctx.cancelled`` can stop it."""
    ctx.progress(1, str(os.getpid()))
    ctypes.CDLL(ctypes.util.find_library("c")).sleep(int(payload["s"]))
    return {"slept": payload["s"]}


def abort(payload, ctx):
    """Kill its own process with SIGABRT."""
    os.abort()


def hold(payload, ctx):
    """Sleep ``payload["s"]`` seconds (in Python), then return its pid."""
    time.sleep(payload["s"])
    return {"pid": os.getpid()}


def polite(payload, ctx):
    """Report its pid, then return as soon as ``ctx.cancelled`` is set (within 60 s)."""
    ctx.progress(1, str(os.getpid()))
    return {"cancelled_seen": ctx.cancelled.wait(60), "pid": os.getpid()}


def refuse(payload, ctx):
    """Fail for good."""
    raise PermanentError("bad input")


def later(payload, ctx):
    """Ask for a retry in 30 s."""
    raise Retry(after_s=30)


async def async_pid(payload, ctx):
    """An async handler: the pid of the process that ran it."""
    return {"pid": os.getpid()}


async def async_ignore(payload, ctx):
    """An async handler that reports its pid as progress, then awaits for
    ``payload["s"]`` seconds without looking at ``ctx.cancelled``."""
    ctx.progress(1, str(os.getpid()))
    await asyncio.sleep(payload["s"])
    return {"pid": os.getpid()}
