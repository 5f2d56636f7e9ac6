"""System test: the demo workload end to end with real processes on a few dozen files.

The demo (``python -m examples.demo``) starts a real gateway against a private
redis-server (``DTQ_REDIS_URL``), two ``dtq-pyworker`` processes and the producer.
Afterwards Redis must hold only key families of the layout table, and the band
streams must be empty (ack deletes the entry, it does not just XACK it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from dtq_gateway import keys
from tests.support.redis_server import free_port

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
FILES = 30
#: Families that carry a TTL (the rest are bounded by trimming or cleaned as they go).
_EXPIRING = {"task", "result", "idempotency", "worker", "scheduler-lock"}


def key_family(key: str) -> str | None:
    """The layout-table family of ``key``, or None when the table has no such key.

    Every candidate is rebuilt with the builders of ``dtq_gateway.keys`` and
    compared, so this test spells no key names of its own.
    """
    if keys.parse_stream(key) is not None:
        return "band-stream"
    singles = {keys.DEAD_LETTER: "dead-letter", keys.AUDIT: "audit",
               keys.RETRY_SCHEDULE: "retry-schedule", keys.RETRY_CLAIMED: "retry-claimed",
               keys.WORKERS: "workers", keys.CANCELLED: "cancelled",
               keys.RECENT_TASKS: "recent-tasks", keys.SCHEDULER_LOCK: "scheduler-lock"}
    if key in singles:
        return singles[key]
    for family, build, pattern in (("task", keys.task, keys.TASK_ID_RE),
                                   ("result", keys.result, keys.TASK_ID_RE),
                                   ("worker", keys.worker, keys.WORKER_ID_RE)):
        prefix = build("")
        if key.startswith(prefix) and pattern.match(key[len(prefix):]):
            return family
    parts = key.split(":")
    if len(parts) == 4 and key == keys.idempotency(parts[2], parts[3]):
        return "idempotency"
    if len(parts) == 4 and key == keys.paused(parts[2]):
        return "paused"
    return None


def run_demo(redis_url: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    """Run the demo on FILES files with private ports; return the process and JSON summary."""
    env = dict(os.environ, DTQ_REDIS_URL=redis_url,
               DTQ_LISTEN=f"127.0.0.1:{free_port()}", DTQ_METRICS_PORT=str(free_port()))
    env.pop("DTQ_GATEWAY", None)
    summary_path = tmp_path / "summary.json"
    cmd = [sys.executable, "-m", "examples.demo", "--files", str(FILES), "--no-node",
           "--timeout", "120", "--json", str(summary_path), "--log-dir", str(tmp_path / "logs")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
                          check=False)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                     for p in sorted((tmp_path / "logs").glob("*.log")))
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{logs}"
    return proc, json.loads(summary_path.read_text())


def test_demo_finishes_every_task_and_leaves_only_layout_keys(redis_url: str,
                                                                tmp_path: Path) -> None:
    proc, summary = run_demo(redis_url, tmp_path)

    by_type = summary["by_type"]
    assert by_type["file.stats"] == FILES
    assert summary["tasks"] == sum(by_type.values())
    assert summary["succeeded"] == by_type["file.stats"] + by_type["file.flaky"]
    assert summary["dead_lettered"] == by_type["file.poison"] + by_type["file.corrupt"]
    assert summary["left_open"] == 0 and summary["other_terminal"] == {}
    assert "left queued or active: 0" in proc.stdout
    # Flaky tasks fail once or twice (alternately), poison ones once before the DLQ.
    assert summary["retried_tasks"] == by_type["file.flaky"] + by_type["file.poison"]
    flaky = by_type["file.flaky"]
    assert summary["retries"] == flaky // 2 * 1 + (flaky - flaky // 2) * 2 + by_type["file.poison"]
    assert summary["files"] == FILES and summary["lines"] > 0 and len(summary["top_words"]) == 10
    assert summary["per_lang"] == {"python": summary["succeeded"]}
    assert summary["throughput_per_s"] > 0
    assert 0 <= summary["queue_wait_p50_ms"] <= summary["queue_wait_p99_ms"]

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        found = {k: key_family(k) for k in client.scan_iter(match=keys.PREFIX + "*", count=1000)}
        assert [k for k, fam in found.items() if fam is None] == []
        streams = [k for k, fam in found.items() if fam == "band-stream"]
        assert streams, "the demo queue's band streams should exist"
        assert {k: client.xlen(k) for k in streams} == {k: 0 for k in streams}
        no_ttl = [k for k, fam in found.items() if fam in _EXPIRING and client.pttl(k) < 0]
        assert no_ttl == []
        dead = client.xlen(keys.DEAD_LETTER)
        assert dead == summary["dead_lettered"]
    finally:
        client.close()
