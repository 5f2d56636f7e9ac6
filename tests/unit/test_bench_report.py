"""The targets table of ``python -m bench``: the issue-21 ratios from synthetic results."""

from __future__ import annotations

from bench import report


def results() -> dict:
    dtq = {"peer": "dtq", "drain_per_s": 3000.0, "enqueue_one_per_s": 1000.0,
           "all_cpu_us_per_task_batch": 400.0, "redis_cpu_us_per_task_batch": 60.0,
           "gateway_redis_cmds_per_task_batch": 8.4,
           "gateway_redis_cmds_per_task_unary_200": 40.0, "e2e_p50_ms": 2.0,
           "e2e_p99_ms": 8.0}
    taskiq = {"peer": "taskiq", "drain_per_s": 2500.0, "enqueue_one_per_s": 4000.0,
              "all_cpu_us_per_task_batch": 500.0, "redis_cpu_us_per_task_batch": 40.0,
              "redis_cmds_per_task_unary_200": 5.0}
    bullmq = {"peer": "bullmq", "drain_per_s": 2000.0}
    return {"dtq": dtq, "peers": [taskiq, bullmq], "floors": {}}


def test_issue_21_rows_hold_the_ratios_and_their_goals() -> None:
    rows = {t["target"]: t for t in report.check_targets(results())}
    assert rows["drain / bullmq"]["value"] == 1.5 and rows["drain / bullmq"]["met"]
    assert rows["all-process CPU per task, batch path (us): gateway + worker + Redis"][
        "value"] == 400.0
    assert rows["all-process CPU per task, batch path: dtq / taskiq (worker + Redis)"][
        "value"] == 0.8
    redis = rows["Redis CPU per task, batch path: dtq / taskiq"]
    assert (redis["value"], redis["goal"], redis["met"]) == (1.5, "<= 1.0x", False)
    cmds = rows["Redis commands per task, batch path"]
    assert (cmds["value"], cmds["met"]) == (8.4, False)
    assert rows["Redis commands per task at 200/s: dtq / taskiq"]["value"] == 8.0
    unary = rows["unary Enqueue one caller: dtq / taskiq"]
    assert (unary["value"], unary["goal"], unary["met"]) == (0.25, ">= 1.0x", False)


def test_report_rows_print_a_dash_for_met_and_missing_figures_print_n_a() -> None:
    data = results()
    del data["peers"][0]["redis_cpu_us_per_task_batch"]
    text = report.targets_table(report.check_targets(data))
    line = next(ln for ln in text.splitlines()
                if ln.startswith("Redis commands per task at 200/s: dtq / taskiq"))
    assert line.split()[-2:] == ["report", "-"]
    line = next(ln for ln in text.splitlines()
                if ln.startswith("Redis CPU per task, batch path: dtq / taskiq"))
    assert line.split()[-4:] == ["n/a", "<=", "1.0x", "n/a"]
