"""deploy/grafana/dtq.json: built by scripts/gen_grafana_dashboard.py (grafanalib) and
up to date with it; every query names only metrics (and labels) the gateway exports,
and the dashboard covers throughput, backlog and its age, wait and run percentiles,
dead letters, retries, workers, and Redis CPU and memory."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_alert_rules import MATCHER_RE, PROMETHEUS_LABELS, SERIES_RE, exported

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dtq.json"
NAME_RE = re.compile(r"\bdtq_[a-z_]+")


def panels() -> list[dict]:
    return json.loads(DASHBOARD.read_text())["panels"]


def queries() -> list[str]:
    return [t["expr"] for p in panels() for t in p["targets"]]


def test_generated_file_is_up_to_date() -> None:
    pytest.importorskip("grafanalib", reason="grafanalib (dev extra) builds the dashboard")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_grafana_dashboard.py"),
                          "--check"], check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("expr", queries())
def test_query_names_exported_metrics_and_labels(expr: str) -> None:
    series = exported()
    names = NAME_RE.findall(expr)
    assert names, f"no dtq_ metric in {expr!r}"
    for name in names:
        assert name in series, f"{name} is not exported by the gateway"
    for name, selector in SERIES_RE.findall(expr):
        for label in MATCHER_RE.findall(selector):
            assert label in series[name] | PROMETHEUS_LABELS, f"{name} has no {label!r}"


def test_queue_variable_reads_an_exported_metric() -> None:
    variables = json.loads(DASHBOARD.read_text())["templating"]["list"]
    (queue,) = [v for v in variables if v["name"] == "queue"]
    assert NAME_RE.findall(queue["query"]) == ["dtq_tasks_enqueued_total"]


def test_dashboard_covers_what_operators_watch() -> None:
    by_title = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in panels()}
    wanted = {
        "Throughput per queue": ["dtq_tasks_succeeded_total"],
        "Backlog (waiting tasks) and leased": ["dtq_queue_depth", "dtq_queue_pending"],
        "Backlog age": ["dtq_queue_backlog_age_seconds"],
        "Queue wait (enqueue to lease)": ["dtq_lease_wait_seconds_bucket"],
        "Run time (lease to ack)": ["dtq_task_run_seconds_bucket"],
        "Dead letters and retries": ["dtq_tasks_dead_lettered_total",
                                     "dtq_tasks_retried_total"],
        "Workers and Lease streams": ["dtq_workers_live"],
        "Redis CPU and memory": ["dtq_redis_cpu_seconds", "dtq_redis_used_memory_bytes"],
    }
    for title, metrics in wanted.items():
        assert title in by_title, title
        for metric in metrics:
            assert metric in by_title[title], f"{title}: {metric}"
    assert "histogram_quantile(0.99" in by_title["Run time (lease to ack)"]
