"""``python -m bench``: floors, dtq and peers side by side on a private redis-server.

Prints one report (absolute numbers, dtq/peer ratios, issue 6 targets) and writes the
JSON to ``bench/results/<UTC timestamp>.json``. ``--quick`` for a quick run (~2 min),
``--smoke`` for the smallest run of every part (tests/system/test_bench_main.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import report
from bench.common import REPO, Sizes, private_redis
from bench.peers.orchestrate import ALL_PEERS

logger = logging.getLogger("bench")
PARTS = ("floors", "dtq", "peers")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes: a quick run (~2 min)")
    p.add_argument("--smoke", action="store_true",
                   help="smallest sizes that still run every part (the bench's own test)")
    p.add_argument("--only", default=",".join(PARTS),
                   help="comma list of parts to run: floors,dtq,peers (default all)")
    p.add_argument("--peers", default=",".join(ALL_PEERS),
                   help=f"comma list of peers (default {','.join(ALL_PEERS)})")
    p.add_argument("--repeat", type=int, default=None,
                   help="runs per figure, medians reported (default 3; 1 with --quick); "
                        "peers outside the targets run once unless --repeat-all-peers")
    p.add_argument("--repeat-all-peers", action="store_true",
                   help="repeat Dramatiq, Celery, arq and Huey --repeat times too (slower)")
    p.add_argument("--profile", action="store_true",
                   help="py-spy the gateway during drain and the 200/s windows (perturbs "
                        "the dtq figures); collapsed stacks go next to the JSON")
    p.add_argument("--out", default=str(REPO / "bench" / "results"),
                   help="directory for the JSON result")
    args = p.parse_args(argv)
    args.only = [x.strip() for x in args.only.split(",") if x.strip()]
    args.peers = [x.strip() for x in args.peers.split(",") if x.strip()]
    for part in args.only:
        if part not in PARTS:
            p.error(f"--only: unknown part {part!r} (choose from {', '.join(PARTS)})")
    for peer in args.peers:
        if peer not in ALL_PEERS:
            p.error(f"--peers: unknown peer {peer!r} (choose from {', '.join(ALL_PEERS)})")
    if args.repeat is None:
        args.repeat = 1 if args.quick or args.smoke else 3
    return args


def _host() -> dict[str, Any]:
    import grpc
    from redis import __version__ as redis_py

    return {"python": platform.python_version(), "cpus": os.cpu_count(),
            "platform": platform.platform(), "grpcio": grpc.__version__, "redis_py": redis_py,
            "commit": _git("rev-parse", "--short", "HEAD"),
            "dirty": bool(_git("status", "--porcelain", "--untracked-files=no"))}


def _git(*args: str) -> str:
    """Output of a git command in the repo ("" when git is unavailable)."""
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                              check=False, timeout=10).stdout.strip()
    except OSError:
        return ""


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the selected parts on one private redis-server; the results dict."""
    sizes = Sizes.for_mode(args.quick, args.repeat, args.repeat_all_peers, smoke=args.smoke)
    started = datetime.now(UTC)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    results: dict[str, Any] = {"started_at": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
                               "mode": mode,
                               "sizes": dataclasses.asdict(sizes), "host": _host()}
    server = private_redis()
    try:
        info = __import__("redis").Redis(port=server.port).info("server")
        results["host"]["redis_server"] = info["redis_version"]
        t0 = time.monotonic()
        if "floors" in args.only:
            from bench.floors import run_floors

            results["floors"] = _safe("floors", lambda: run_floors(server.url, sizes))
        if "dtq" in args.only:
            from bench.dtq_bench import run_dtq

            logger.warning("dtq ...")
            profile_dir = None
            if args.profile:
                stamp = results["started_at"].replace(":", "")
                profile_dir = Path(args.out) / f"profile-{stamp}"
            results["dtq"] = run_dtq(server.url, sizes, profile_dir)
        if "peers" in args.only:
            from bench.peers.orchestrate import run_peers

            results["peers"] = run_peers(server.url, sizes, args.peers)
        results["elapsed_s"] = round(time.monotonic() - t0, 1)
    finally:
        server.cleanup()
    results["targets"] = report.check_targets(results)
    return results


def _safe(name: str, fn: Any) -> dict[str, Any]:
    """Run one part; an unexpected error becomes ``{"na": reason}``."""
    try:
        return fn()
    except Exception as exc:
        logger.exception("%s failed", name)
        return {"na": f"{type(exc).__name__}: {exc}"}


def main(argv: list[str] | None = None) -> int:
    """Entry point: run, print the report, write the JSON."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    results = run(args)
    print(report.render(results))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, results["started_at"].replace(":", "") + ".json")
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
    print(f"\nelapsed {results.get('elapsed_s')} s; JSON written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
