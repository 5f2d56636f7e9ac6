"""``dtq-pyworker module:attr``: run a Worker defined in a Python module.

``attr`` names a :class:`~dtq_pyworker.Worker` or a zero-argument callable
returning one. Flags override the Worker's own settings; environment variables
``DTQ_GATEWAY``, ``DTQ_QUEUES`` (or ``DTQ_QUEUE``), ``DTQ_CONCURRENCY``, ``DTQ_MAX_IN_FLIGHT``,
``DTQ_WORKER_ID``, ``DTQ_POOL``, ``DTQ_DRAIN_GRACE_MS``, ``DTQ_ACK_FLUSH_MS`` and
``DTQ_LOG_LEVEL`` are the flag defaults (``DTQ_TOKEN``, ``DTQ_TLS`` and
``DTQ_TLS_CA`` are read by the Worker itself). Exit status: 0 after a drain,
1 when the gateway refused the worker (auth, bad request), 2 for a bad spec.
This module is the only place that configures logging.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

import grpc

from dtq_pyworker._channel import check_target
from dtq_pyworker.errors import DtqRpcError
from dtq_pyworker.worker import MAX_QUEUES, POOLS, Worker, check_queues

log = logging.getLogger("dtq_pyworker.cli")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``dtq-pyworker`` (env ``DTQ_*`` give the defaults)."""
    env = os.environ
    p = argparse.ArgumentParser(prog="dtq-pyworker",
                                description="Run a dtq Worker defined as module:attr.")
    p.add_argument("spec", help="module:attr naming a Worker or a callable returning one")
    p.add_argument("--target", default=env.get("DTQ_GATEWAY"),
                   help="gateway address HOST:PORT (env DTQ_GATEWAY)")
    p.add_argument("--queues", default=env.get("DTQ_QUEUES") or env.get("DTQ_QUEUE"),
                   help=f"comma-separated queues, 1..{MAX_QUEUES} (a Lease session's limit; "
                        "env DTQ_QUEUES, or DTQ_QUEUE for one)")
    p.add_argument("--concurrency", type=int, default=_int_env("DTQ_CONCURRENCY"),
                   help="handler slots (env DTQ_CONCURRENCY)")
    p.add_argument("--max-in-flight", type=int, default=_int_env("DTQ_MAX_IN_FLIGHT"),
                   help="leases held at once, default 2 * concurrency (env DTQ_MAX_IN_FLIGHT)")
    p.add_argument("--worker-id", default=env.get("DTQ_WORKER_ID"),
                   help="worker id, default host-pid-random (env DTQ_WORKER_ID)")
    p.add_argument("--pool", choices=POOLS, default=env.get("DTQ_POOL") or None,
                   help="where handlers run: thread (default) or process, which kills a "
                        "handler past its timeout_ms (env DTQ_POOL)")
    grace_ms = _int_env("DTQ_DRAIN_GRACE_MS")
    p.add_argument("--drain-grace", type=float, metavar="SECONDS",
                   default=grace_ms / 1000.0 if grace_ms is not None else None,
                   help="grace for running handlers on SIGTERM/SIGINT, in s "
                        "(env DTQ_DRAIN_GRACE_MS, in ms)")
    p.add_argument("--ack-flush-ms", type=float, default=_int_env("DTQ_ACK_FLUSH_MS"),
                   help="how long results wait to be batched, in ms (env DTQ_ACK_FLUSH_MS)")
    p.add_argument("--log-level", default=env.get("DTQ_LOG_LEVEL", "INFO"),
                   help="DEBUG, INFO, WARNING or ERROR (env DTQ_LOG_LEVEL)")
    return p


def _int_env(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value else None


def load_worker(spec: str) -> Worker:
    """Import ``module:attr`` and return the Worker it names.

    Raises:
        ValueError: The spec is malformed.
        TypeError: The spec does not lead to a Worker.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected module:attr, got {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, Worker) and callable(obj):
        obj = obj()
    if not isinstance(obj, Worker):
        raise TypeError(f"{spec} is not a dtq_pyworker.Worker")
    return obj


def flag_queues(text: str) -> list[str]:
    """The queues of ``--queues`` (comma-separated; blanks around names ignored).

    Raises:
        ValueError: Naming ``--queues`` (see :func:`~dtq_pyworker.worker.check_queues`).
    """
    return check_queues([q.strip() for q in text.split(",") if q.strip()], "--queues")


def apply_flags(worker: Worker, args: argparse.Namespace) -> None:
    """Override the worker's settings with the flags that were given."""
    if args.target:
        worker.target = args.target
    if args.queues:
        worker.queues = flag_queues(args.queues)
    if args.concurrency:
        had_default = worker.max_in_flight == 2 * worker.concurrency
        worker.concurrency = args.concurrency
        if had_default:
            worker.max_in_flight = 2 * args.concurrency
    if args.max_in_flight:
        worker.max_in_flight = args.max_in_flight
    if args.worker_id:
        worker.worker_id = args.worker_id
    if args.pool:
        worker.pool = args.pool
    if args.drain_grace is not None:
        worker.drain_grace_s = args.drain_grace
    if args.ack_flush_ms is not None:
        worker.ack_flush_ms = args.ack_flush_ms


_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "taskName"}


class _ExtraFormatter(logging.Formatter):
    """Plain-text lines with the record's ``extra`` fields appended as key=value."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = [f"{k}={v}" for k, v in vars(record).items() if k not in _RECORD_ATTRS]
        return f"{line} {' '.join(extras)}" if extras else line


def configure_logging(level: str) -> None:
    """Log to stderr with extras visible (the CLI only; the library never does this)."""
    handler = logging.StreamHandler()
    handler.setFormatter(_ExtraFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``dtq-pyworker``; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        configure_logging(args.log_level)
    except ValueError:
        print(f"dtq-pyworker: unknown log level {args.log_level!r}", file=sys.stderr)
        return 2
    # the flags first: the module's own errors would hide these
    try:
        if args.queues:
            flag_queues(args.queues)
        if args.target:
            check_target(args.target, "--target")
    except ValueError as exc:
        print(f"dtq-pyworker: {exc}", file=sys.stderr)
        return 2
    try:
        worker = load_worker(args.spec)
    except (ImportError, AttributeError, ValueError, TypeError) as exc:
        log.error("cannot load %s: %s", args.spec, exc)
        return 2
    apply_flags(worker, args)
    log.info("starting worker %s on %s, queues=%s, concurrency=%d, pool=%s", worker.worker_id,
             worker.target, ",".join(worker.queues), worker.concurrency, worker.pool)
    try:
        worker.run()
    except ValueError as exc:  # a setting the worker refused before connecting (pool)
        log.error("cannot start worker %s: %s", worker.worker_id, exc)
        return 2
    except DtqRpcError as exc:
        if exc.code == grpc.StatusCode.INVALID_ARGUMENT:
            # a field of the worker's own configuration: reconnecting cannot help
            log.error("worker %s stopped: the gateway refused its Lease request as invalid "
                      "(field %s): %s. This is a configuration error (worker id, queues, "
                      "task types, labels, hostname); fix it and restart the worker, it "
                      "does not retry", worker.worker_id, exc.field or "not named",
                      exc.message)
        else:
            log.error("worker %s stopped: the gateway refused it: %s", worker.worker_id, exc)
        return 1
    log.info("worker %s drained: %s", worker.worker_id, worker.stats)
    if worker.threads_busy:
        # A stopped sync handler that ignores ctx.cancelled would keep the
        # interpreter from exiting (pool threads are joined at exit).
        log.warning("%d sync handler thread(s) still running after the drain grace; their "
                    "tasks were handed back (%d released this run: another worker takes them "
                    "at once, no attempt spent; one whose release could not be sent is "
                    "reclaimed after the visibility timeout); exiting without waiting for "
                    "the threads", worker.threads_busy, worker.stats.get("released", 0))
        logging.shutdown()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
