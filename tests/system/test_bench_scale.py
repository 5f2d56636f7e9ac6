"""``python -m bench.scale`` runs end to end and writes its figures; no timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.scale import derive, enqueue_plan, parse_matrix

ROOT = Path(__file__).resolve().parents[2]
PHASE_FIELDS = {"tasks", "wall_s", "tasks_per_s", "redis_cores", "redis_cpu_us_per_task",
                "gateway_cpu_us_per_task", "worker_cpu_us_per_task", "redis_calls_per_task_all",
                "redis_calls_per_task_no_scripts", "redis_script_calls_per_task", "commands"}


def test_parse_matrix_reads_gateways_by_workers() -> None:
    assert parse_matrix("1x1, 4x8,8×12") == [(1, 1), (4, 8), (8, 12)]
    for bad in ("1", "0x2", "ax1", "1x"):
        with pytest.raises(ValueError):
            parse_matrix(bad)


def test_enqueue_plan_splits_evenly_over_queues_in_batches_of_500() -> None:
    plan = enqueue_plan(1203, ["a", "b"])
    assert plan == [("a", 500), ("b", 500), ("a", 102), ("b", 101)]
    assert enqueue_plan(3, ["scale"]) == [("scale", 3)]


def test_derive_counts_script_lines_apart() -> None:
    raw = {"wall_s": 2.0, "redis_cpu_s": 0.5, "gateway_cpu_s": 1.0, "worker_cpu_s": 0.25,
           "commands": {"evalsha": [10, 400], "xadd": [100, 100], "hset": [100, 80]}}
    out = derive(raw, 100)
    assert out["redis_cpu_us_per_task"] == 5000.0 and out["redis_cores"] == 0.25
    assert out["redis_calls_per_task_all"] == 2.1
    assert out["redis_calls_per_task_no_scripts"] == 2.0
    assert out["redis_script_calls_per_task"] == 0.1
    assert out["commands"]["evalsha"] == {"calls_per_task": 0.1, "usec_per_task": 4.0}


@pytest.mark.system
def test_scale_bench_smoke_run_writes_every_field(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "bench.scale", "--matrix", "1x1", "--tasks", "200",
         "--skip-taskiq", "--no-plot", "--out", str(tmp_path), "--phase-timeout", "60"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = tmp_path.glob("scale-*.json")
    result = json.loads(path.read_text())
    (cell,) = result["dtq"]
    assert (cell["gateways"], cell["workers"], cell["queues"]) == (1, 1, 1)
    for phase in ("enqueue", "drain", "all"):
        assert PHASE_FIELDS <= cell[phase].keys(), phase
    assert cell["drain"]["handled"] >= 200
    assert cell["all"]["commands"], "INFO commandstats deltas are kept per command"
    assert result["summary"]["cells"][0]["cell"] == "1x1"
    assert "one-Redis ceiling dtq" in proc.stdout
