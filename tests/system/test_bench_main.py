"""``python -m bench --smoke`` runs every part to completion: floors, dtq (the 1,000 idle
Lease streams included) and the peers, and prints the targets table. No timing is
asserted: the figures are printed, never checked here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.peers.orchestrate import ALL_PEERS

pytestmark = [pytest.mark.system, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
#: dtq figures the report's targets and ratios need (a missing one prints n/a)
DTQ_FIGURES = {"enqueue_one_per_s", "drain_per_s", "e2e_p50_ms", "e2e_p99_ms",
               "gateway_cpu_us_per_task_batch", "redis_cpu_us_per_task_batch",
               "worker_cpu_us_per_task_batch", "all_cpu_us_per_task_batch",
               "gateway_redis_cmds_per_task_batch", "gateway_redis_cmds_per_task_unary_200",
               "scale_idle_streams", "scale_lease_p50_ms_idle", "mem_bytes_per_queued_task"}

ALL_CPU = "all-process CPU per task, batch path (us): gateway + worker + Redis"


@pytest.mark.timeout(600)
def test_bench_smoke_runs_every_part_and_prints_the_targets(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "bench", "--smoke", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=540,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = tmp_path.glob("*.json")
    result = json.loads(path.read_text())
    assert result["mode"] == "smoke"
    assert "na" not in result["floors"], result["floors"]
    assert "na" not in result["dtq"], result["dtq"]["na"]
    missing = DTQ_FIGURES - result["dtq"].keys()
    assert not missing, missing
    assert result["dtq"]["scale_idle_streams"] == 1000
    assert [p["peer"] for p in result["peers"]] == ALL_PEERS  # each has figures or "na"
    targets = {t["target"]: t for t in result["targets"]}
    for name in ("drain / bullmq", ALL_CPU, "Redis CPU per task, batch path: dtq / taskiq",
                 "Redis commands per task at 200/s", "e2e p99 at 200/s (ms)",
                 "unary Enqueue one caller: dtq / taskiq"):
        assert name in targets, name
    for name in (ALL_CPU, "Redis commands per task at 200/s", "e2e p50 at 200/s (ms)"):
        assert targets[name]["value"] is not None, name  # dtq's own figures
    assert "== Targets" in proc.stdout and "dtq" in proc.stdout
