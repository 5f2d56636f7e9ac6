"""Install the peers (own virtualenv, npm) and run each one as a bounded subprocess.

Runs in dtq's venv. A peer that fails to install or to run is reported as
``{"peer": name, "na": "reason"}`` and never stops the bench.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import REPO, Sizes, redis_db_url

logger = logging.getLogger(__name__)
BENCH = REPO / "bench"
VENV = BENCH / ".peers-venv"
REQUIREMENTS = BENCH / "requirements-peers.txt"
BULLMQ_DIR = BENCH / "peers" / "bullmq"
# Each peer gets its own Redis database on the private server (dtq and floors use 0).
PYTHON_PEERS = {"taskiq": 1, "dramatiq": 2, "celery": 3, "arq": 4, "huey": 5}
BULLMQ_DB = 6
ALL_PEERS = [*PYTHON_PEERS, "bullmq"]
#: Peers the issue-6 targets compare against: measured ``--repeat`` times (medians).
#: The others are context and run once unless ``--repeat-all-peers`` is given, which
#: keeps a full run under 15 minutes on a slow 2-core VM (Celery and arq alone drain
#: a 20,000 backlog at ~400/s there: ~4 min each for three runs).
TARGET_PEERS = frozenset({"taskiq", "bullmq"})


def _run(cmd: list[str], cwd: Path, timeout_s: float) -> None:
    """Run an install command; raise RuntimeError with its output tail on failure."""
    proc = subprocess.run(cmd, check=False, cwd=cwd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        tail = [ln for ln in lines if not ln.startswith("WARNING")][-3:]
        raise RuntimeError(f"{' '.join(cmd[:3])} failed: {' | '.join(tail)}")


def ensure_python_peers() -> None:
    """Create bench/.peers-venv from requirements-peers.txt unless it is up to date.

    Lines marked ``# no-deps`` are installed in a second call with ``--no-deps``.
    When a joint install fails, each line is tried alone so that one broken peer
    does not take the others down. A stamp holding the requirements' sha256 (written
    only after a complete install) skips the work on later runs.

    Raises:
        RuntimeError: venv creation or pip failed (message has the output tail).
    """
    text = REQUIREMENTS.read_text()
    digest = hashlib.sha256(text.encode()).hexdigest()
    stamp = VENV / ".bench-stamp"
    if stamp.exists() and stamp.read_text() == digest:
        return
    logger.warning("installing peers into %s (first run takes a minute)", VENV)
    python = shutil.which("python3") or sys.executable
    _run([python, "-m", "venv", "--clear", str(VENV)], BENCH, 300)
    pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
    lines = [ln.split("#")[0].strip() for ln in text.splitlines()]
    with_deps = [ln for ln, raw in zip(lines, text.splitlines()) if ln and "no-deps" not in raw]
    no_deps = [ln for ln, raw in zip(lines, text.splitlines()) if ln and "no-deps" in raw]
    failed = _install(pip, with_deps) + _install(pip + ["--no-deps"], no_deps)
    if failed:
        # The peers that did install still run; the others report their import error.
        logger.warning("peer packages that did not install: %s", "; ".join(failed))
        return
    stamp.write_text(digest)


def _install(pip: list[str], requirements: list[str]) -> list[str]:
    """pip-install ``requirements`` together, else one by one; the failures' messages."""
    if not requirements:
        return []
    try:
        _run(pip + requirements, BENCH, 900)
        return []
    except (RuntimeError, subprocess.TimeoutExpired):
        pass
    failed = []
    for req in requirements:
        try:
            _run(pip + [req], BENCH, 600)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            failed.append(f"{req}: {exc}")
    return failed


def ensure_bullmq() -> None:
    """``npm ci`` in bench/peers/bullmq unless node_modules matches the lock file.

    Raises:
        RuntimeError: node/npm missing or npm failed.
    """
    npm = shutil.which("npm")
    if not npm or not shutil.which("node"):
        raise RuntimeError("node/npm not on PATH")
    lock = (BULLMQ_DIR / "package-lock.json").read_bytes()
    stamp = BULLMQ_DIR / "node_modules" / ".bench-stamp"
    digest = hashlib.sha256(lock).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return
    _run([npm, "ci", "--no-audit", "--no-fund"], BULLMQ_DIR, 600)
    stamp.write_text(digest)


def _peer_cmd(peer: str, redis_url: str, sizes: dict, out_dir: str) -> tuple[list[str], Path]:
    if peer == "bullmq":
        return ["node", str(BULLMQ_DIR / "bench.mjs"), json.dumps(sizes), out_dir], BULLMQ_DIR
    url = redis_db_url(redis_url, PYTHON_PEERS[peer])
    return ([str(VENV / "bin" / "python"), "-m", "bench.peers.runner", peer, "--redis-url", url,
             "--sizes", json.dumps(sizes), "--out-dir", out_dir], REPO)


def run_peer(peer: str, redis_url: str, sizes: Sizes) -> dict[str, Any]:
    """Run one peer as a subprocess with a hard timeout; its figures or an ``na`` reason."""
    repeat = sizes.repeat if peer in TARGET_PEERS or sizes.repeat_all_peers else 1
    spec = {"enqueue_n": sizes.enqueue_n, "backlog_n": sizes.backlog_n,
            "latency_rate": sizes.latency_rate, "latency_s": sizes.latency_s,
            "repeat": repeat, "timeout_s": sizes.peer_timeout_s / 2}
    out_dir = tempfile.mkdtemp(prefix=f"dtq-bench-{peer}-")
    cmd, cwd = _peer_cmd(peer, redis_url, spec, out_dir)
    env = dict(os.environ, BENCH_REDIS_URL=redis_db_url(redis_url, BULLMQ_DB),
               PYTHONPATH=str(REPO))
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=sizes.peer_timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"peer": peer, "na": f"timed out after {sizes.peer_timeout_s:.0f} s"}
    finally:
        _kill_group(proc.pid)
    for line in reversed(stdout.splitlines()):
        if line.startswith("BENCH_RESULT "):
            shutil.rmtree(out_dir, ignore_errors=True)
            return {**json.loads(line.removeprefix("BENCH_RESULT ")), "repeat": repeat}
    tail = " | ".join((stderr or stdout).strip().splitlines()[-2:])[-300:]
    return {"peer": peer, "na": f"exit {proc.returncode}: {tail} (logs in {out_dir})"}


def _kill_group(pgid: int) -> None:
    """SIGKILL whatever the peer left behind in its process group (worker children)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_peers(redis_url: str, sizes: Sizes, names: list[str]) -> list[dict[str, Any]]:
    """Install (once) and run the named peers in turn; one result dict per peer."""
    results: list[dict[str, Any]] = []
    py_error = bullmq_error = None
    if any(n in PYTHON_PEERS for n in names):
        try:
            ensure_python_peers()
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            py_error = f"install failed: {exc}"
    if "bullmq" in names:
        try:
            ensure_bullmq()
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            bullmq_error = f"install failed: {exc}"
    for name in names:
        error = bullmq_error if name == "bullmq" else py_error
        if error:
            results.append({"peer": name, "na": error})
            continue
        logger.warning("peer %s ...", name)
        results.append(run_peer(name, redis_url, sizes))
        logger.warning("peer %s: %s", name, results[-1])
    return results
