"""Conformance worker built on dtq_pyworker: the conf.* task types of docs/protocol.md.

Configured like any conformance worker through the environment: DTQ_GATEWAY,
DTQ_QUEUES (or DTQ_QUEUE), DTQ_WORKER_ID, DTQ_CONCURRENCY, DTQ_MAX_IN_FLIGHT,
DTQ_DRAIN_GRACE_MS, DTQ_TOKEN, DTQ_LOG_LEVEL. Prints a one-line JSON summary on exit.

Run: python tests/conformance/workers/pyworker_conf.py
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from typing import Any

from dtq_pyworker import DtqRpcError, PermanentError, TaskContext, Worker


class ConfFailure(RuntimeError):
    """The retryable failure conf.fail raises."""


class ConfPermanentFailure(PermanentError):
    """The non-retryable failure conf.fail raises."""


def _int_env(name: str, default: int | None) -> int | None:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else default


def build_worker() -> Worker:
    """A Worker with the conf.* handlers, configured from DTQ_* variables."""
    queues = [q for q in (os.environ.get("DTQ_QUEUES") or os.environ.get("DTQ_QUEUE")
                          or "").split(",") if q.strip()]
    if not queues:
        sys.exit("pyworker_conf: DTQ_QUEUES (or DTQ_QUEUE) is required")
    worker = Worker(
        queues=[q.strip() for q in queues],
        target=os.environ.get("DTQ_GATEWAY") or None,
        concurrency=_int_env("DTQ_CONCURRENCY", 4) or 4,
        max_in_flight=_int_env("DTQ_MAX_IN_FLIGHT", None),
        worker_id=os.environ.get("DTQ_WORKER_ID") or None,
        drain_grace_s=(_int_env("DTQ_DRAIN_GRACE_MS", 30000) or 0) / 1000,
    )

    @worker.task("conf.echo")
    async def echo(payload: Any, ctx: TaskContext) -> bytes:
        # The raw payload bytes, byte-exact whatever the content type (bytes
        # results are sent as-is).
        return ctx.payload_bytes

    @worker.task("conf.sleep")
    async def sleep(payload: Any, ctx: TaskContext) -> dict[str, int]:
        ms = int((payload or {}).get("ms", 0))
        await asyncio.sleep(ms / 1000)  # cancellation is delivered by dtq_pyworker
        return {"slept_ms": ms}

    @worker.task("conf.fail")
    async def fail(payload: Any, ctx: TaskContext) -> None:
        payload = payload or {}
        message = str(payload.get("message", "conf.fail"))
        if payload.get("retryable", True) is False:
            raise ConfPermanentFailure(message)
        raise ConfFailure(message)

    return worker


def main() -> int:
    """Run until SIGTERM/SIGINT drains the worker."""
    logging.basicConfig(level=os.environ.get("DTQ_LOG_LEVEL", "INFO").upper(),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s",
                        stream=sys.stderr)
    worker = build_worker()
    code = 0
    try:
        worker.run()
    except DtqRpcError as exc:  # refused for good (auth, bad request): stop and report
        logging.getLogger("pyworker_conf").error("gateway refused the worker: %s", exc)
        code = 3
    print(json.dumps({"worker": "python", "worker_id": worker.worker_id, **worker.stats,
                      "exit_code": code}), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
