"""``dtq cancel --filter``, ``dtq purge`` and ``dtq search`` against a real gateway."""

from __future__ import annotations

import time

import pytest


def _enqueue(env, queue: str, task_type: str, *meta: str) -> str:
    args = ["enqueue", queue, task_type, "{}", "-q"]
    for m in meta:
        args += ["--meta", m]
    res = env.run(*args)
    assert res.exit_code == 0, res.output
    return res.stdout.strip()


def _status(env, task_id: str) -> str:
    return env.json("get", task_id)["status"]


def test_cancel_by_filter_dry_run_then_for_real(env):
    eu = [_enqueue(env, "bulk1", "mail", "region=eu") for _ in range(3)]
    us = _enqueue(env, "bulk1", "mail", "region=us")
    dry = env.json("cancel", "--filter", "queue=bulk1", "--filter", "meta.region=eu",
                   "--filter", "type=mail", "--dry-run")
    assert (dry["matched"], dry["cancelled"], sorted(dry["task_ids"])) == (3, 0, sorted(eu))
    assert _status(env, eu[0]) == "QUEUED"
    # without --yes it asks; "n" changes nothing
    res = env.run("cancel", "--filter", "queue=bulk1", "--filter", "meta.region=eu",
                  input="n\n")
    assert res.exit_code == 1 and _status(env, eu[0]) == "QUEUED"
    assert "Cancel every waiting task of bulk1 matching" in res.stderr
    res = env.run("cancel", "--filter", "queue=bulk1", "--filter", "status=active",
                  input="n\n")  # running tasks too: the question says so
    assert res.exit_code == 1 and "(running ones are asked to stop)?" in res.stderr
    res = env.run("cancel", "--filter", "queue=bulk1", "--filter", "meta.region=eu",
                  "--reason", "eu outage", "--yes")
    assert res.exit_code == 0 and "cancelled 3 of 3" in res.stdout
    assert {_status(env, t) for t in eu} == {"CANCELLED"}
    assert _status(env, us) == "QUEUED"
    audit = env.json("audit", "-n", "5")
    assert audit[0]["action"] == "cancel_tasks" and audit[0]["task_id"] == "bulk1"
    assert '"reason":"eu outage"' in audit[0]["detail"]


def test_purge_cancels_the_queues_waiting_tasks(env):
    ids = [_enqueue(env, "bulk2", "mail") for _ in range(4)]
    res = env.run("purge", "bulk2", "--dry-run")
    assert res.exit_code == 0 and "4 waiting tasks" in res.stdout
    assert env.json("purge", "bulk2", "--yes")["cancelled"] == 4
    assert {_status(env, t) for t in ids} == {"CANCELLED"}
    assert env.json("audit", "-n", "1")[0]["action"] == "purge_queue"
    assert env.run("purge", "no-such-queue", "--yes").exit_code == 3


def test_search_finds_a_task_by_metadata(env):
    _enqueue(env, "bulk3", "mail", "user=1")
    hit = _enqueue(env, "bulk3", "mail", "user=42")
    found = env.json("search", "--meta", "user=42", "--queue", "bulk3")
    assert [t["task_id"] for t in found["tasks"]] == [hit]
    res = env.run("search", "--meta", "user=42", "--queue", "bulk3")
    assert res.exit_code == 0 and hit in res.stdout
    # one task per page: the next page's token is printed, and --page goes on
    first = env.run("search", "--queue", "bulk3", "-n", "1")
    assert first.exit_code == 0 and hit in first.stdout
    token = first.stderr.split("--page ")[1].strip()
    second = env.json("search", "--queue", "bulk3", "-n", "1", "--page", token)
    assert [t["metadata"]["user"] for t in second["tasks"]] == ["1"]


@pytest.mark.parametrize("args,says", [
    (["cancel"], "give a task ID or --filter"),
    (["cancel", "0" * 32, "--filter", "queue=bulk1"], "not both or neither"),
    (["cancel", "--filter", "type=mail"], "queue=Q is required"),
    (["cancel", "--filter", "queue=bulk1", "--filter", "colour=red"], "unknown filter 'colour'"),
    (["cancel", "--filter", "queue=bulk1", "--filter", "status=succeeded"],
     "status 'succeeded': queued, scheduled or active"),
    (["cancel", "--filter", "queue=bulk1", "--filter", "older-than=soon"], "older-than:"),
    (["search", "--meta", "novalue"], "'novalue' is not K=V")])
def test_bad_filters_are_usage_errors_that_say_why(env, args, says):
    res = env.run(*args, "--yes") if args[0] == "cancel" else env.run(*args)
    assert res.exit_code == 2, (res.exit_code, res.output)
    assert says in res.stderr


def test_cancel_by_filter_flags_a_running_task_only_with_status_active(env):
    tid = _enqueue(env, "cli", "slow", "job=flag")  # the worker serves "cli": it runs
    deadline = time.monotonic() + 30
    while _status(env, tid) != "ACTIVE":  # poll with a deadline
        assert time.monotonic() < deadline, "the slow task never started"
        time.sleep(0.05)
    plain = env.json("cancel", "--filter", "queue=cli", "--filter", "meta.job=flag", "--yes")
    assert (plain["matched"], plain["cancel_requested"]) == (0, 0)
    flagged = env.json("cancel", "--filter", "queue=cli", "--filter", "meta.job=flag",
                       "--filter", "status=active", "--yes")
    assert (flagged["matched"], flagged["cancel_requested"]) == (1, 1)
    assert env.json("get", tid)["cancel_requested"] is True
