"""``python -m bench.durable_acks`` runs end to end and reports both settings; no timing
is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.system
def test_durable_acks_bench_smoke_run_reports_both_settings(tmp_path: Path) -> None:
    out = tmp_path / "durable.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.durable_acks", "--tasks", "20", "--out", str(out)],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path)),
        capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    for key in ("replicas_ack_0", "replicas_ack_1"):
        row = result[key]
        assert row["enqueue_latency"]["samples"] == row["ack_latency"]["samples"] == 20
        assert row["enqueue_per_s"] > 0 and row["batch_per_s"] > 0 and row["ack_per_s"] > 0
        assert row["redis_cpu_us_per_task"] >= 0
