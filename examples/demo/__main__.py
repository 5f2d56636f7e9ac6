"""``python -m examples.demo``: the whole dtq system on the standard library.

Honours ``DTQ_REDIS_URL`` (unset: the gateway starts an embedded redis-server),
``DTQ_LISTEN`` and ``DTQ_METRICS_PORT`` like the gateway itself. Exit status 0
when every task reached a terminal state, 1 when some did not (or could not be
enqueued, or a process had to be killed), 2 when the system could not start.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import grpc

from examples.demo import processes
from examples.demo.processes import DemoError, Endpoints, Proc
from examples.demo.producer import plan, stdlib_files
from examples.demo.summary import render

log = logging.getLogger("examples.demo")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line flags of the demo."""
    parser = argparse.ArgumentParser(prog="python -m examples.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=None, metavar="N",
                        help="process only the first N stdlib files (default: all)")
    parser.add_argument("--no-node", action="store_true",
                        help="do not start the Node worker even when it is installed")
    parser.add_argument("--go", action="store_true",
                        help="also start the Go worker (clients/go, built by make install)")
    parser.add_argument("--workers", type=int, default=2, metavar="N",
                        help="dtq-pyworker processes to start (default 2)")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="S",
                        help="deadline for every task to be terminal, in s (default 600)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="also write the summary as JSON to PATH")
    parser.add_argument("--log-dir", type=Path, default=processes.DEFAULT_LOG_DIR, metavar="DIR",
                        help="directory of the process logs (default .dtq/demo)")
    parser.add_argument("--log-level", default="WARNING", help="log level of the demo itself")
    args = parser.parse_args(argv)
    if args.files is not None and args.files < 1:
        parser.error("--files must be >= 1")
    return args


def _check_ports(ep: Endpoints) -> None:
    host, _, port = ep.listen.rpartition(":")
    processes.ensure_port_free(host, int(port), "gRPC (DTQ_LISTEN)")
    if ep.metrics_port:
        processes.ensure_port_free(host, ep.metrics_port, "metrics (DTQ_METRICS_PORT)")


def _start_workers(args: argparse.Namespace, env: dict[str, str],
                   ep: Endpoints) -> tuple[list[Proc], dict[str, str]]:
    """Start the workers; return them and worker_id -> language."""
    workers, langs = [], {}
    for i in range(1, args.workers + 1):
        worker_id = f"demo-py{i}-{os.getpid()}"
        workers.append(processes.start_python_worker(i, env, ep.target, worker_id, args.log_dir))
        langs[worker_id] = "python"
    if not args.no_node and processes.node_worker_available():
        worker_id = f"demo-node-{os.getpid()}"
        workers.append(processes.start_node_worker(env, worker_id, args.log_dir))
        langs[worker_id] = "node"
        print("workers: a Node worker joins the Python ones (examples/node-worker)")
    elif not args.no_node:
        print("workers: Node worker not installed (npm ci in examples/node-worker); Python only")
    if args.go and processes.go_worker_available():
        worker_id = f"demo-go-{os.getpid()}"
        workers.append(processes.start_go_worker(env, worker_id, args.log_dir))
        langs[worker_id] = "go"
        print("workers: a Go worker joins them (clients/go)")
    elif args.go:
        print(f"workers: Go worker not built ({processes.GO_WORKER_BIN.relative_to(processes.ROOT)}"
              " is missing: make install builds it where Go is installed); without it")
    return workers, langs


def _save_metrics(ep: Endpoints, log_dir: Path) -> str:
    """Scrape the gateway's metrics once into ``log_dir/metrics.txt``; return the path."""
    if not ep.metrics_url:
        return ""
    try:
        with urllib.request.urlopen(ep.metrics_url, timeout=3) as resp:
            body = resp.read()
    except (urllib.error.URLError, OSError) as exc:
        log.warning("could not scrape %s: %s", ep.metrics_url, exc)
        return ""
    path = log_dir / "metrics.txt"
    path.write_bytes(body)
    return _show(path)


def _show(path: Path) -> str:
    """A path relative to the repository when inside it."""
    try:
        return str(path.resolve().relative_to(processes.ROOT))
    except ValueError:
        return str(path)


def _shutdown(log_dir: Path, interrupted: bool) -> bool:
    """Stop every process the demo started: the workers (they drain), then the gateway
    (it stops its embedded Redis); True when nothing had to be killed.

    Ctrl-C does not cut this short: a stop started by Ctrl-C is cut short by the next
    one (what still runs is killed), a normal stop by the second one. A Ctrl-C during
    a normal stop still ends the demo as interrupted (KeyboardInterrupt, exit 130).
    """
    workers = [p for p in processes.SPAWNED if p.name != "gateway"]
    gateways = [p for p in processes.SPAWNED if p.name == "gateway"]
    with processes.interrupts_counted() as noted:
        def hurry() -> bool:
            return len(noted) >= (1 if interrupted else 2)

        killed = processes.stop(workers, timeout_s=45.0, hurry=hurry)
        killed += processes.stop(gateways, timeout_s=30.0, hurry=hurry)
        if processes.SPAWNED:
            codes = ", ".join(f"{p.name} {p.popen.returncode}" for p in workers + gateways)
            print(f"shutdown: exit codes {codes}; logs in {_show(log_dir)}")
        if killed:
            print(f"shutdown: had to kill {', '.join(killed)}", file=sys.stderr)
    if noted and not interrupted:
        raise KeyboardInterrupt
    return not killed


def _run_workload(args: argparse.Namespace, ep: Endpoints, specs: list,
                  langs: dict[str, str]) -> bool:
    from examples.demo import workload  # imports tqdm and the stubs only when needed

    summary, errors = asyncio.run(workload.run(ep.target, specs, langs, args.timeout))
    print(render(summary))
    if args.json:
        args.json.write_text(summary.to_json())
    for err in errors[:5]:
        print(f"enqueue refused: {err}", file=sys.stderr)
    return not errors and summary.left_open == 0


def run(args: argparse.Namespace) -> int:
    """Start everything, run the workload, stop everything; return the exit status."""
    ep = Endpoints.from_env(os.environ)
    _check_ports(ep)
    specs = plan(stdlib_files(args.files))
    n_stats = sum(1 for s in specs if s.task_type == "file.stats")
    print(f"dtq demo: {len(specs):,} tasks ({n_stats:,} stdlib files + "
          f"{len(specs) - n_stats} that fail on purpose) on {ep.target}")
    env = processes.child_env(os.environ, ep)
    ok = clean = interrupted = False
    scraped = ""
    try:
        gateway = processes.start_gateway(env, args.log_dir)
        processes.wait_gateway_ready(gateway, ep.target)
        print(f"gateway: {gateway.first_line()}")
        _, langs = _start_workers(args, env, ep)
        ok = _run_workload(args, ep, specs, langs)
        scraped = _save_metrics(ep, args.log_dir)
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        clean = _shutdown(args.log_dir, interrupted)
    if scraped:
        print(f"metrics: Prometheus metrics were at {ep.metrics_url} "
              f"(last scrape saved to {scraped})")
    elif ep.metrics_url:
        print(f"metrics: nothing answered at {ep.metrics_url}")
    return 0 if ok and clean else 1


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM: do what SIGINT does now (asyncio.run's handler cancels the workload)."""
    signal.raise_signal(signal.SIGINT)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m examples.demo``."""
    args = parse_args(argv)
    # SIGTERM (e.g. from a CI timeout) stops the demo like Ctrl-C: children are stopped too.
    signal.signal(signal.SIGTERM, _interrupt)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        return run(args)
    except DemoError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    except grpc.RpcError as exc:  # the gateway went away or refused a call mid-run
        print(f"demo: gateway call failed: {exc.code().name} {exc.details()} "
              f"(see the logs in {_show(args.log_dir)})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("demo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
