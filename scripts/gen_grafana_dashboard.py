"""Build the Grafana dashboard deploy/grafana/dtq.json from code (grafanalib).

Usage: python scripts/gen_grafana_dashboard.py [--check]

Every query reads a metric the gateway exports (tests/unit/test_grafana_dashboard.py
checks that). Queue, worker and Redis gauges are read from Redis by every replica (the
same value on each), so panels take max() over replicas; counters and histograms are
per replica and are summed. ``--check`` exits 1 when the checked-in file differs from
what this script builds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafanalib._gen import DashboardEncoder
from grafanalib.core import (
    Dashboard,
    GridPos,
    Target,
    Template,
    Templating,
    TimeSeries,
)

OUT = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "dtq.json"
DS = "${datasource}"
QUEUE = 'queue=~"$queue"'


def panel(title: str, targets: list[tuple[str, str]], unit: str, x: int, y: int,
          description: str) -> TimeSeries:
    """A 12 x 8 time series panel of PromQL ``(expr, legend)`` pairs."""
    return TimeSeries(
        title=title, description=description, dataSource=DS, unit=unit,
        gridPos=GridPos(h=8, w=12, x=x, y=y),
        targets=[Target(expr=expr, legendFormat=legend, refId=chr(ord("A") + i),
                        datasource=DS) for i, (expr, legend) in enumerate(targets)])


def quantiles(metric: str) -> list[tuple[str, str]]:
    """p50 and p99 per queue of a seconds histogram."""
    return [((f"histogram_quantile({q}, sum by (le, queue) "
              f"(rate({metric}_bucket{{{QUEUE}}}[5m])))"), f"p{int(q * 100)} {{{{queue}}}}")
            for q in (0.5, 0.99)]


def dashboard() -> Dashboard:
    """The dtq dashboard: throughput, backlog, wait and run times, failures, workers,
    Redis."""
    panels = [
        panel("Throughput per queue", [
            (f"sum by (queue) (rate(dtq_tasks_enqueued_total{{{QUEUE}}}[5m]))",
             "enqueued {{queue}}"),
            (f"sum by (queue) (rate(dtq_tasks_succeeded_total{{{QUEUE}}}[5m]))",
             "succeeded {{queue}}")],
            "ops", 0, 0, "Tasks enqueued and finished per second, all gateways together."),
        panel("Backlog (waiting tasks) and leased", [
            ((f"sum by (queue) (max by (queue, band) (dtq_queue_depth{{{QUEUE}}}) - "
              f"max by (queue, band) (dtq_queue_pending{{{QUEUE}}}))"), "waiting {{queue}}"),
            (f"sum by (queue) (max by (queue, band) (dtq_queue_pending{{{QUEUE}}}))",
             "leased {{queue}}")],
            "short", 12, 0, "Live tasks only: tasks past their expiry are not counted."),
        panel("Backlog age", [
            (f"max by (queue) (dtq_queue_backlog_age_seconds{{{QUEUE}}})", "{{queue}}")],
            "s", 0, 8, "Age of the oldest task not yet leased: the autoscaling signal."),
        panel("Queue wait (enqueue to lease)", quantiles("dtq_lease_wait_seconds"),
              "s", 12, 8, "p50 and p99 of the time from creation to lease."),
        panel("Run time (lease to ack)", quantiles("dtq_task_run_seconds"),
              "s", 0, 16, "p50 and p99 of the handler run time."),
        panel("Dead letters and retries", [
            (f"sum by (queue) (increase(dtq_tasks_dead_lettered_total{{{QUEUE}}}[5m]))",
             "dead-lettered {{queue}}"),
            (f"sum by (queue) (increase(dtq_tasks_retried_total{{{QUEUE}}}[5m]))",
             "retried {{queue}}"),
            (f"max by (queue) (dtq_queue_stuck_tasks{{{QUEUE}}})", "stuck {{queue}}")],
            "short", 12, 16, "Per 5 minutes; stuck = waiting tasks no live worker takes."),
        panel("Workers and Lease streams", [
            ("max(dtq_workers_live)", "live workers"),
            ("sum(dtq_lease_sessions)", "Lease streams")],
            "short", 0, 24, "Workers with a recent heartbeat; open Lease streams."),
        panel("Redis CPU and memory", [
            ("max(rate(dtq_redis_cpu_seconds[5m]))", "CPU (share of one core)"),
            ("max(dtq_redis_used_memory_bytes) / max(dtq_redis_maxmemory_bytes > 0)",
             "memory used / maxmemory")],
            "percentunit", 12, 24,
            "From the gateways' metrics (INFO cpu and memory). One core bounds Redis."),
    ]
    templating = Templating(list=[
        Template(name="datasource", label="Data source", type="datasource",
                 query="prometheus", default="Prometheus"),
        Template(name="queue", label="Queue", dataSource=DS, includeAll=True,
                 multi=True, default="$__all", allValue=".*",
                 query="label_values(dtq_tasks_enqueued_total, queue)"),
    ])
    return Dashboard(title="dtq", uid="dtq-overview", tags=["dtq"], timezone="utc",
                     refresh="30s", panels=panels, templating=templating)


def render() -> str:
    """The dashboard as JSON text (sorted keys, newline at the end)."""
    data = dashboard().auto_panel_ids().to_json_data()
    return json.dumps(data, cls=DashboardEncoder, indent=2, sort_keys=True) + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv[1:]:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python scripts/gen_grafana_dashboard.py")
            return 1
        print("grafana dashboard is up to date")
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
