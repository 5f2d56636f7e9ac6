"""``python -m bench.schedule_fires`` runs end to end and prints its figures; no timing is
asserted (the rates it measures live in docs/schedules.md, not in the suite)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_schedule_fires_benchmark_smoke_run_prints_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.schedule_fires", "--schedules", "20", "--seconds", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    figures = json.loads(out.stdout)
    assert figures["schedules"] == 20 and figures["due_per_s"] == 20
    assert figures["fires"] > 0 and figures["fires_per_s"] > 0
    assert figures["fires_per_schedule_min"] >= 0 and figures["missed"] >= 0
    assert set(figures) >= {"window_s", "fires_per_schedule_median", "late"}
