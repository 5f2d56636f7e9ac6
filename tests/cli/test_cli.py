"""The ``dtq`` command line against a real gateway (tokens on) and a private Redis:
every subcommand, in table and ``--json`` form, and every documented exit code."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime

import pytest

from dtq_cli import ExitCode
from dtq_cli.render import ago, extra_fields, parse_duration_ms
from dtq_gateway.store import keys
from dtq_proto import dtq_pb2
from tests.cli.conftest import SERVED
from tests.support.threaded_gateway import ADMIN_TOKEN, PRODUCER_TOKEN

MISSING = "0" * 32


def _parse_iso(text: str) -> datetime:
    assert text.endswith("Z"), text
    return datetime.fromisoformat(text)


def _poll(predicate, timeout_s: float = 10.0, interval_s: float = 0.02):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(interval_s)


def test_duration_and_relative_time_parsing():
    assert [parse_duration_ms(t) for t in ("250ms", "30s", "5m", "1h30m", "2d", "1.5", "0")] \
        == [250, 30_000, 300_000, 5_400_000, 172_800_000, 1500, 0]
    for bad in ("soon", "5x", "m5", "", "5m soon"):
        with pytest.raises(ValueError):
            parse_duration_ms(bad)
    assert ago(1_000, now_ms=4_000) == "3.0s ago" and ago(10_000, now_ms=4_000) == "in 6.0s"
    assert ago(0) == "-"


def test_fields_a_view_does_not_know_are_still_printed():
    task = dtq_pb2.Task(task_id="t1", queue="q", status=dtq_pb2.TASK_STATUS_SUCCEEDED,
                        timeout_ms=1500, updated_at_ms=1_000, metadata={"a": "b"})
    assert extra_fields(task, {"task_id", "queue", "metadata"}) == [
        ("status", "SUCCEEDED"), ("timeout ms", 1500), ("updated at", "1970-01-01T00:00:01.000Z")]


def test_float_fields_are_rounded_for_reading():
    stats = dtq_pb2.GetQueueStatsResponse(queue="q", succeeded_per_s=0.3709267605111371)
    task = dtq_pb2.Task(task_id="t1", progress_percent=33.33333)
    assert extra_fields(stats, {"queue"}) == [("succeeded per s", "0.371")]
    assert extra_fields(task, {"task_id"}) == [("progress percent", "33.3")]


def test_enqueue_wait_and_get_a_succeeding_task(env):
    doc = env.json("enqueue", SERVED, "ok", '{"n": 1}', "--wait", "--wait-timeout", "10s")
    assert doc["status"] == "SUCCEEDED" and doc["result"] == {"echo": {"n": 1}}
    assert doc["payload"] == {"n": 1} and doc["attempts"][0]["outcome"] == "succeeded"
    created = _parse_iso(doc["created_at"])
    assert abs((datetime.now(UTC) - created).total_seconds()) < 60
    assert _parse_iso(doc["finished_at"]) >= created and doc["expires_at"] is None
    task_id = doc["task_id"]
    assert env.json("get", task_id) == doc | {"updated_at": doc["updated_at"]}
    human = env.run("get", task_id)
    assert human.exit_code == 0
    assert "SUCCEEDED" in human.stdout and '{"echo": {"n": 1}}' in human.stdout
    assert "ago)" in human.stdout and "w-cli" in human.stdout  # times and the attempts table
    plain = env.run("enqueue", SERVED, "ok", '{"n": 2}')
    new_id, status = plain.stdout.split()
    assert plain.exit_code == 0 and keys.TASK_ID_RE.match(new_id) and status in ("QUEUED", "SUCCEEDED")
    assert env.run("wait", new_id, "--timeout", "10s").exit_code == 0


def test_enqueue_options_reach_the_task(env):
    first = env.json("enqueue", "idle", "t", '{"a": 1}', "--priority", "8", "--delay", "5m",
                     "--key", "k-opts", "--max-attempts", "2", "--task-timeout", "2m",
                     "--meta", "team=ops", "--meta", "x=")
    assert first["status"] == "SCHEDULED" and not first["deduplicated"]
    again = env.json("enqueue", "idle", "t", '{"a": 1}', "--key", "k-opts")
    assert again == {**first, "deduplicated": True}
    task = env.json("get", first["task_id"])
    assert (task["priority"], task["max_attempts"], task["timeout_ms"]) == (8, 2, 120_000)
    assert task["idempotency_key"] == "k-opts" and task["metadata"] == {"team": "ops", "x": ""}
    due_in_s = (_parse_iso(task["due_at"]) - _parse_iso(task["created_at"])).total_seconds()
    assert 299 <= due_in_s <= 301
    text = env.json("enqueue", "idle", "t", "hello", "--content-type", "text/plain")
    assert env.json("get", text["task_id"])["payload"] == "hello"
    piped = env.json("enqueue", "idle", "t", "-", input='{"from": "stdin"}')
    assert env.json("get", piped["task_id"])["payload"] == {"from": "stdin"}


def test_enqueue_debounce_options(env):
    opts = ("--debounce-key", "doc-7", "--debounce-window", "1m", "--debounce-max-delay", "5m")
    first = env.json("enqueue", "idle", "t", '{"v": 1}', *opts)
    again = env.json("enqueue", "idle", "t", '{"v": 2}', *opts)
    assert (first["debounced"], first["status"]) == (False, "SCHEDULED")
    assert again == {**first, "debounced": True}
    task = env.json("get", first["task_id"])
    assert task["payload"] == {"v": 2}  # keep-last is the default mode
    kept = env.run("enqueue", "idle", "t", '{"v": 3}', "--debounce-key", "rep",
                   "--debounce-mode", "keep-first")
    absorbed = env.run("enqueue", "idle", "t", '{"v": 4}', "--debounce-key", "rep",
                       "--debounce-mode", "keep-first")
    assert "debounced" not in kept.stdout and absorbed.stdout.split()[0] == kept.stdout.split()[0]
    assert "(debounced into the burst's task)" in absorbed.stdout
    bad = env.run("enqueue", "idle", "t", "{}", "--debounce-key", "x", "--debounce-mode",
                  "keep-first", "--debounce-max-delay", "5m")
    assert bad.exit_code != 0 and "debounce.max_delay_ms" in bad.stderr
    for flag, value in (("--debounce-window", "5s"), ("--debounce-mode", "keep-first"),
                        ("--debounce-max-delay", "5m")):  # a flag without its key: a typo
        alone = env.run("enqueue", "idle", "t", "{}", flag, value)
        assert alone.exit_code == ExitCode.USAGE and "needs --debounce-key" in alone.stderr


def test_wait_exit_codes_tell_the_outcome(env):
    failed = env.run("enqueue", SERVED, "boom", "{}", "--wait")
    assert failed.exit_code == ExitCode.TASK_FAILED == 4
    assert "DEAD_LETTERED" in failed.stdout and "PermanentError: kaput" in failed.stderr
    queued = env.json("enqueue", "idle", "t", "{}")["task_id"]
    timed_out = env.run("wait", queued, "--timeout", "100ms")
    assert timed_out.exit_code == ExitCode.WAIT_TIMEOUT == 7 and "still QUEUED" in timed_out.stderr
    assert env.json("cancel", queued)["status"] == "CANCELLED"
    cancelled = env.run("--json", "wait", queued)
    assert cancelled.exit_code == ExitCode.TASK_CANCELLED == 5
    assert json.loads(cancelled.stdout)["status"] == "CANCELLED"
    expiring = env.json("enqueue", "idle", "t", "{}", "--delay", "200ms", "--ttl", "100ms")
    expired = env.run("wait", expiring["task_id"], "--timeout", "10s")
    assert expired.exit_code == ExitCode.TASK_EXPIRED == 6, expired.output


def test_cancel_a_running_task_in_people_form(env):
    task_id = env.json("enqueue", SERVED, "slow", "{}")["task_id"]
    _poll(lambda: env.client.get(task_id).status.name == "ACTIVE")
    res = env.run("cancel", task_id, "--reason", "test")
    assert res.exit_code == 0 and "cancellation requested" in res.stdout
    assert env.run("wait", task_id, "--timeout", "10s").exit_code == ExitCode.TASK_CANCELLED
    again = env.run("cancel", task_id)
    assert again.exit_code == ExitCode.ERROR and "FAILED_PRECONDITION" in again.stderr


@pytest.mark.parametrize("args", [
    ("get", MISSING), ("wait", MISSING), ("cancel", MISSING), ("stats", "no-such-queue"),
    ("dlq", "requeue", MISSING), ("dlq", "discard", MISSING),
])
def test_unknown_things_exit_3(env, args):
    res = env.run(*args)
    assert res.exit_code == ExitCode.NOT_FOUND == 3, res.output
    assert res.stderr.startswith("dtq: ") and res.stdout == ""


@pytest.mark.parametrize("args", [
    ("enqueue", "q", "t", "{not json"), ("enqueue", "q", "t", "{}", "--priority", "12"),
    ("enqueue", "q", "t", "{}", "--delay", "soon"), ("enqueue", "q", "t", "{}", "--meta", "x"),
    ("recent", "--status", "HAPPY"), ("frobnicate",), ("dlq", "requeue"),
    # a call deadline that is not > 0 (or too far for gRPC) would be DEADLINE_EXCEEDED
    ("--timeout", "0", "queues"), ("--timeout", "-1", "queues"),
    ("--timeout", "nan", "queues"), ("--timeout", "inf", "queues"),
    # a port out of range would be wrapped round by grpc to some other port
    ("--gateway", "127.0.0.1:99999", "queues"), ("--gateway", "127.0.0.1:0", "queues"),
    ("--gateway", "127.0.0.1:", "queues"),
    # a bare IPv6 address (grpc would dial [::1]:443), a scheme grpc cannot dial
    ("--gateway", "::1", "queues"), ("--gateway", "http://127.0.0.1:50051", "queues"),
    ("--gateway", "unix:", "queues"),
])
def test_usage_errors_exit_2_and_send_nothing(env, args):
    before = len(env.client.recent_tasks(limit=1000))
    res = env.run(*args)
    assert res.exit_code == ExitCode.USAGE == 2, res.output
    assert len(env.client.recent_tasks(limit=1000)) == before


@pytest.mark.parametrize("args", [
    ("limits", "set", SERVED, "999999999999"), ("limits", "set", SERVED, "1000001"),
    ("limits", "set", SERVED, "10", "--burst", "99999999999"),
    ("limits", "set", SERVED, "10", "--per", "99999999999999999999d"),
    ("limits", "set", SERVED, "10", "--per", "2d"),
    # a zero the gateway would read as its default (1 s, 60 s, no TTL)
    ("limits", "set", SERVED, "10", "--per", "0s"),
    ("limits", "set", SERVED, "10", "--per", "0.4ms"),
    ("enqueue", SERVED, "ok", "{}", "--task-timeout", "0"),
    ("enqueue", SERVED, "ok", "{}", "--ttl", "0s"),
    ("enqueue", SERVED, "ok", "{}", "--delay", "99999999999999999999d"),
    ("enqueue", SERVED, "ok", "{}", "--task-timeout", "99999999d"),
    ("enqueue", SERVED, "ok", "{}", "--ttl", "99999999999999999999d"),
    ("dlq", "redrive", "--older-than", "999999999999999999999d"),
    ("dlq", "redrive", "--rate", "10001"),
    ("schedules", "create", "cli-huge", SERVED, "ok", "--every", "99999999999999999999d"),
    ("schedules", "create", "cli-huge", SERVED, "ok", "--every", "999ms"),
    ("wait", MISSING, "--timeout", "99999999999999999999d"),
])
def test_values_out_of_the_fields_range_are_usage_errors(env, args):
    """Numbers beyond what the protocol field takes are refused before anything is sent
    (not a protobuf overflow traceback, not a call the gateway refuses)."""
    def state():
        limits = [(r.queue, r.task_type, r.limit, r.period_ms, r.burst)  # not the tokens
                  for r in env.client.rate_limits()]
        return (len(env.client.recent_tasks(limit=1000)), limits,
                [s.schedule.name for s in env.client.schedules()], len(env.client.audit(1000)))

    before = state()
    res = env.run(*args)
    assert res.exit_code == ExitCode.USAGE, res.output
    assert "not in the range" in res.stderr
    assert state() == before


def test_gateway_refusals_map_to_exit_codes(env):
    refused = env.run("enqueue", "bad queue!", "t", "{}")
    assert refused.exit_code == ExitCode.ERROR and "(field queue)" in refused.stderr
    down = env.run("--gateway", "127.0.0.1:1", "queues")
    assert down.exit_code == ExitCode.UNAVAILABLE == 8 and "DTQ_GATEWAY" in down.stderr
    anonymous = env.run("queues", token=None)
    assert anonymous.exit_code == ExitCode.PERMISSION == 9
    producer = env.run("queues", token=PRODUCER_TOKEN)
    assert producer.exit_code == ExitCode.PERMISSION and "PERMISSION_DENIED" in producer.stderr
    # a producer token may enqueue; the token may come from DTQ_TOKEN like the workers'
    ok = env.run("--json", "enqueue", "idle", "t", "{}", token=None,
                 env={"DTQ_TOKEN": PRODUCER_TOKEN})
    assert ok.exit_code == 0 and json.loads(ok.stdout)["status"] == "QUEUED"


def test_redis_down_exits_10_with_a_redis_hint():
    """docs/cli.md: the gateway answered but cannot reach Redis: exit 10 and a hint about
    Redis, not exit 8 and one about the gateway address."""
    from click.testing import CliRunner

    from dtq_cli import cli
    from tests.support.redis_server import RedisServer
    from tests.support.threaded_gateway import ThreadedGateway

    server = RedisServer(appendonly=False).start()
    gw = ThreadedGateway(server.url).start()
    try:
        server.stop()
        res = CliRunner().invoke(cli, ["--gateway", gw.target, "--timeout", "30", "queues"],
                                 env={"DTQ_GATEWAY": None, "DTQ_TOKEN": None},
                                 catch_exceptions=False)
    finally:
        gw.stop()
        server.cleanup()
    assert res.exit_code == ExitCode.REDIS_UNAVAILABLE == 10, res.output
    assert res.stderr.startswith("dtq: UNAVAILABLE REDIS_UNAVAILABLE: ")
    assert f"the gateway at {gw.target} answered but cannot reach its Redis" in res.stderr
    assert "DTQ_GATEWAY" not in res.stderr


def test_error_lines_name_the_reason_once_and_the_flag(env):
    """An error's reason is not a repeat of its code ("NOT_FOUND NOT_FOUND"), and pausing
    an unknown queue points at the --create flag."""
    missing = env.run("get", MISSING)
    assert missing.exit_code == ExitCode.NOT_FOUND
    assert missing.stderr.startswith("dtq: NOT_FOUND: ") and "NOT_FOUND NOT_FOUND" not in \
        missing.stderr
    unknown = env.run("pause", "never-seen-q")
    assert unknown.exit_code == ExitCode.NOT_FOUND
    assert "pass --create to pause it" in unknown.stderr and "set create" not in unknown.stderr


def test_quiet_wait_prints_only_the_id(env):
    """docs/cli.md: `-q` prints only the task id, with `--wait` as well (the exit code
    tells the outcome)."""
    ok = env.run("enqueue", SERVED, "ok", "{}", "--wait", "-q")
    assert ok.exit_code == 0 and ok.stdout.count("\n") == 1 and " " not in ok.stdout.strip()
    assert env.client.get(ok.stdout.strip()).status.name == "SUCCEEDED"
    failed = env.run("enqueue", SERVED, "boom", "{}", "--wait", "-q")
    assert failed.exit_code == ExitCode.TASK_FAILED
    assert len(failed.stdout.splitlines()) == 1 and "DEAD_LETTERED" in failed.stderr


def test_a_task_cancelled_before_it_ran_shows_no_attempt(env):
    task_id = env.json("enqueue", "never-ran-q", "t", "{}")["task_id"]
    assert env.run("cancel", task_id).exit_code == 0
    shown = env.run("get", task_id).stdout
    assert "attempt:" in shown and "none of 3 (never ran)" in shown and "1 of 3" not in shown
    listed = env.run("recent", "--queue", "never-ran-q").stdout
    assert "none/3" in listed and "1/3" not in listed
    waiting = env.json("enqueue", "never-ran-q", "t", "{}")["task_id"]
    assert "1 of 3 (not started)" in env.run("get", waiting).stdout


def test_queues_stats_pause_and_resume(env):
    for prio in ("2", "9", "9"):
        env.json("enqueue", "stats-q", "t", "{}", "--priority", prio)
    after = env.run("queues", "--json")  # --json after the command works as well
    assert after.exit_code == 0 and json.loads(after.stdout) == env.json("queues")
    queues = {q["name"]: q for q in env.json("queues")}
    assert queues["stats-q"] == {"name": "stats-q", "depth": 3, "pending": 0, "paused": False}
    stats = env.json("stats", "stats-q")
    assert stats["depth"] == 3 and stats["oldest_task_age_ms"] >= 0
    assert {b["band"]: b["depth"] for b in stats["bands"] if b["depth"]} == {9: 2, 2: 1}
    human = env.run("stats", "stats-q")
    assert human.exit_code == 0 and "bands" in human.stdout and "depth:" in human.stdout
    assert env.run("pause", "stats-q").stdout.strip() == "stats-q paused"
    assert "already paused" in env.run("pause", "stats-q").stdout
    assert env.json("stats", "stats-q")["paused"] is True
    assert "paused" in env.run("queues").stdout
    assert env.run("resume", "stats-q", "--reason", "done").stdout.strip() == "stats-q resumed"
    assert env.json("resume", "stats-q")["changed"] is False


def test_queues_and_stats_read_as_words(env):
    """docs/cli.md: `dtq queues` shows depth, leased and paused; `dtq stats` says its
    numbers in words, never raw field names such as "throughput window ms"."""
    for task_type in ("send", "send", "build"):
        env.json("enqueue", "words-q", task_type, "{}")
    env.json("stats", "words-q")  # a first reading starts the throughput window
    header = env.run("queues").stdout.splitlines()[1]
    assert "leased" in header and "pending" not in header
    deadline = time.monotonic() + 30
    while "succeeded/s" not in (human := env.run("stats", "words-q").stdout):
        assert time.monotonic() < deadline, human  # the rate window is at least 1 s
        time.sleep(0.2)
    assert "leased:" in human and "pending" not in human
    assert "outcomes:" in human and "0 succeeded, 0 failed" in human
    assert "waiting by type: send 2, build 1" in human
    for raw in ("throughput window ms", "waiting complete", "succeeded per s", "True"):
        assert raw not in human, raw


def test_delete_queue(env):
    task_id = env.json("enqueue", "gone-q", "t", "{}")["task_id"]
    busy = env.run("delete-queue", "gone-q", "--yes")
    assert busy.exit_code == ExitCode.ERROR and "QUEUE_NOT_EMPTY" in busy.stderr
    assert "depth=1" in busy.stderr
    env.json("cancel", task_id)  # a queued task's entry goes at once: the queue is drained
    dry = env.json("delete-queue", "gone-q", "--dry-run")
    assert (dry["deleted"], dry["dry_run"]) == (False, True)
    assert keys.stream("gone-q", 5) in dry["keys"]
    assert "nothing changed" in env.run("delete-queue", "gone-q", "--dry-run").stdout
    refused = env.run("delete-queue", "gone-q", input="n\n")
    assert refused.exit_code == 1 and "gone-q" in {q["name"] for q in env.json("queues")}
    done = env.run("delete-queue", "gone-q", "--reason", "retired", input="y\n")
    assert done.exit_code == 0, done.output
    # the keys the dry run listed; the leader's duties may drop one meanwhile (the busy
    # marker of a drained queue) or add a history sample
    deleted = re.fullmatch(r"gone-q deleted \((\d+) keys\)", done.stdout.strip())
    assert deleted and abs(int(deleted.group(1)) - len(dry["keys"])) <= 1, done.stdout
    assert "gone-q" not in {q["name"] for q in env.json("queues")}
    assert env.json("audit", "-n", "1")[0]["action"] == "delete_queue"
    again = env.run("delete-queue", "gone-q", "--yes")
    assert again.exit_code == ExitCode.NOT_FOUND and "QUEUE_NOT_FOUND" in again.stderr
    bad = env.run("delete-queue", "bad queue!", "--yes")
    assert bad.exit_code == ExitCode.ERROR and "(field queue)" in bad.stderr


def test_dead_letter_commands(env):
    ids = [env.json("enqueue", SERVED, "boom", json.dumps({"i": i}))["task_id"]
           for i in range(3)]
    for task_id in ids:
        assert env.run("wait", task_id, "--timeout", "10s").exit_code == ExitCode.TASK_FAILED
    listed = {e["task_id"]: e for e in env.json("dlq", "ls", "--queue", SERVED, "-n", "500")}
    assert set(ids) <= set(listed)
    entry = listed[ids[0]]
    assert (entry["payload"], entry["last_error_class"]) == ({"i": 0}, "PermanentError")
    assert _parse_iso(entry["failed_at"])
    assert "kaput" in env.run("dlq", "ls").stdout
    dry = env.json("dlq", "redrive", "--queue", SERVED, "--type", "boom", "--dry-run")
    assert dry["matched"] >= 3 and dry["requeued"] == 0 and dry["dry_run"] is True
    assert set(ids) <= set(dry["task_ids"])
    assert "nothing changed" in env.run("dlq", "redrive", "--type", "boom", "--dry-run").stdout
    assert env.json("dlq", "discard", ids[0]) == {
        "discarded": [{"task_id": ids[0], "request_id": env.json("audit", "-n", "1")[0]
                       ["request_id"]}], "not_found": []}
    requeued = env.run("dlq", "requeue", ids[1], MISSING)  # one real, one unknown
    assert requeued.exit_code == ExitCode.NOT_FOUND and f"{ids[1]} requeued" in requeued.stdout
    assert env.run("wait", ids[1], "--timeout", "10s").exit_code == ExitCode.TASK_FAILED
    as_json = env.json("dlq", "requeue", ids[2])
    assert [d["task_id"] for d in as_json["requeued"]] == [ids[2]] and not as_json["not_found"]
    redrive = env.run("dlq", "redrive", "--queue", SERVED, "--type", "boom",
                      "--older-than", "0s")
    assert redrive.exit_code == 0 and "requeued" in redrive.stdout
    _poll(lambda: all(env.client.get(t).terminal for t in ids))  # redriven ones failed again
    left = len(env.json("dlq", "ls", "-n", "1000"))
    refused = env.run("dlq", "purge", input="n\n")
    assert refused.exit_code == 1 and len(env.json("dlq", "ls", "-n", "1000")) == left
    purged = env.json("dlq", "purge", "--yes")
    assert purged["purged"] >= 1 and env.json("dlq", "ls") == []
    assert env.run("dlq", "ls").stdout.strip() == "no dead letters"


def test_workers_recent_and_audit(env):
    workers = {w["worker_id"]: w for w in env.json("workers")}
    me = workers["w-cli"]
    assert me["alive"] and me["status"] == "alive" and me["concurrency"] == 4
    assert _parse_iso(me["last_heartbeat_at"]) and isinstance(me["heartbeat_age_ms"], int)
    assert "w-cli" in env.run("workers").stdout
    task_id = env.json("enqueue", "recent-q", "t", '{"r": 1}')["task_id"]
    recent = env.json("recent", "--queue", "recent-q", "--status", "queued")
    assert [t["task_id"] for t in recent] == [task_id] and recent[0]["status"] == "QUEUED"
    assert task_id in env.run("recent", "-n", "5").stdout
    env.json("cancel", task_id, "--reason", "audit me")
    entries = env.json("audit", "-n", "50")
    mine = [e for e in entries if e["task_id"] == task_id]
    assert mine and mine[0]["action"] == "cancel_task" and mine[0]["actor"] == "ops"
    assert _parse_iso(mine[0]["ts"])
    assert "cancel_task" in env.run("audit").stdout


def test_tail_prints_json_lines(env):
    stop = threading.Event()

    def produce():  # enqueue until tail has seen its events (no history on subscribe)
        while not stop.is_set():
            env.client.enqueue("tail-q", "t", {"tail": True})
            stop.wait(0.05)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        res = env.run("--json", "tail", "--queue", "tail-q", "--type", "task_queued",
                      "--count", "2")
    finally:
        stop.set()
        producer.join(5)
    assert res.exit_code == 0, res.output
    assert "Ctrl-C" in res.stderr  # the banner: subscribed (stderr, so stdout stays JSON)
    lines = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(lines) == 2
    assert all(ev["type"] == "TASK_QUEUED" and ev["queue"] == "tail-q" for ev in lines)
    assert all(keys.TASK_ID_RE.match(ev["task_id"]) for ev in lines)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_tail_exits_0_on_ctrl_c_or_sigterm(env, sig):
    proc = subprocess.Popen(
        [sys.executable, "-m", "dtq_cli", "--gateway", env.gw.target, "tail"],
        env={**os.environ, "DTQ_TOKEN": ADMIN_TOKEN}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        banner = proc.stderr.readline()  # printed once subscribed (docs/cli.md)
        assert "Ctrl-C" in banner
        task_id = env.client.enqueue("tail-q", "t", {}).task_id
        # an event published right after the banner is printed: nothing is missed
        lines = iter(proc.stdout.readline, "")
        assert any(f"task={task_id}" in line for line in lines)
        proc.send_signal(sig)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_tail_prints_no_banner_when_it_could_not_subscribe(env):
    """The banner means subscribed: a refused subscription (a bad filter) prints the
    gateway's error and no banner."""
    res = env.run("tail", "--queue", "a b")
    assert res.exit_code == 1, res.output
    assert "Ctrl-C" not in res.stderr and "queues:" in res.stderr


def test_tail_ends_with_exit_8_when_its_gateway_drains():
    """docs/cli.md: a gateway that drains (stops) ends ``dtq tail`` with exit 8."""
    from tests.support.redis_server import RedisServer
    from tests.support.threaded_gateway import ThreadedGateway

    server = RedisServer(appendonly=False).start()
    gw = ThreadedGateway(server.url).start()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dtq_cli", "--gateway", gw.target, "tail"],
        env={k: v for k, v in os.environ.items() if not k.startswith("DTQ_")},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    running = True
    try:
        assert "Ctrl-C" in proc.stderr.readline()  # the banner comes once subscribed
        gw.stop()
        running = False
        assert proc.wait(15) == ExitCode.UNAVAILABLE
        assert "UNAVAILABLE" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        if running:
            gw.stop()
        server.cleanup()


def test_schedules_limits_and_pause_create(env):
    """Schedules and rate limits are driven from the CLI; pausing a queue that has no task
    yet needs --create (else exit 3, not found)."""
    made = env.run("schedules", "create", "cli-tick", SERVED, "ok", '{"s": 1}',
                   "--every", "1h", "--paused")
    assert made.exit_code == 0 and "created" in made.stdout
    dup = env.run("schedules", "create", "cli-tick", SERVED, "ok", "{}", "--every", "1h")
    assert dup.exit_code != 0  # ALREADY_EXISTS without --replace
    (info,) = [s for s in env.json("schedules", "ls") if s["schedule"]["name"] == "cli-tick"]
    assert info["schedule"]["paused"] is True
    assert "cli-tick" in env.run("schedules", "ls").stdout
    fired = env.run("schedules", "trigger", "cli-tick")
    task_id = fired.stdout.strip()
    assert fired.exit_code == 0 and env.run("wait", task_id, "--timeout", "10s").exit_code == 0
    assert env.run("schedules", "resume", "cli-tick").exit_code == 0
    assert "deleted" in env.run("schedules", "delete", "cli-tick").stdout
    assert env.json("schedules", "ls") == [] or all(
        s["schedule"]["name"] != "cli-tick" for s in env.json("schedules", "ls"))

    assert "set" in env.run("limits", "set", SERVED, "50", "--per", "1s").stdout
    (limit,) = env.json("limits", "ls", "--queue", SERVED)
    assert (limit["limit"], int(limit["period_ms"])) == (50, 1000)
    assert "removed" in env.run("limits", "rm", SERVED).stdout
    assert env.json("limits", "ls", "--queue", SERVED) == []

    missing = env.run("pause", "cli-never-seen")
    assert missing.exit_code == ExitCode.NOT_FOUND
    assert env.run("pause", "cli-never-seen", "--create").exit_code == 0
    assert env.run("resume", "cli-never-seen").exit_code == 0


def test_deep_json_payload_is_a_usage_error(env):
    deep = "[" * 5000 + "]" * 5000
    res = env.run("enqueue", SERVED, "ok", "-", input=deep)
    assert res.exit_code == ExitCode.USAGE and "nested too deeply" in res.output


@pytest.mark.parametrize("payload", ['"\\ud800"', '{"k": "\\udfff"}'])
def test_a_json_payload_that_is_no_unicode_text_is_a_usage_error(env, payload):
    """A lone surrogate escape is valid JSON syntax but no UTF-8 text: refused before
    sending, not a traceback."""
    before = len(env.client.recent_tasks(limit=1000))
    res = env.run("enqueue", SERVED, "ok", payload)
    assert res.exit_code == ExitCode.USAGE, res.output
    assert "not valid Unicode text" in res.stderr and "Traceback" not in res.output
    assert len(env.client.recent_tasks(limit=1000)) == before


@pytest.mark.parametrize("kind", ["missing", "directory", "no permission", "not UTF-8"])
def test_an_unreadable_payload_file_is_a_usage_error(env, tmp_path, kind):
    path = tmp_path / "payload.json"
    if kind == "directory":
        path.mkdir()
    elif kind == "no permission":
        if os.geteuid() == 0:
            pytest.skip("root reads files whatever their mode")
        path.write_text("{}")
        path.chmod(0)
    elif kind == "not UTF-8":
        path.write_bytes(b'"\xff"')
    before = len(env.client.recent_tasks(limit=1000))
    res = env.run("enqueue", SERVED, "ok", f"@{path}")
    assert res.exit_code == ExitCode.USAGE, res.output
    assert "Invalid value for PAYLOAD" in res.stderr and str(path) in res.stderr
    assert "Traceback" not in res.output
    assert len(env.client.recent_tasks(limit=1000)) == before


def test_every_enum_renders_by_its_short_name():
    """cli.md: "enum values are short names", for every dtq.v1 enum (chain states and
    schedule catch-up policies too, not only statuses and event types)."""
    from dtq_cli.render import enum_name
    from dtq_proto import dtq_pb2 as pb

    task = pb.Task.DESCRIPTOR.fields_by_name
    assert enum_name(task["status"], pb.TASK_STATUS_SUCCEEDED) == "SUCCEEDED"
    assert enum_name(task["chain_state"], pb.CHAIN_STATE_BROKEN) == "BROKEN"
    catch_up = pb.Schedule.DESCRIPTOR.fields_by_name["catch_up"]
    assert enum_name(catch_up, pb.SCHEDULE_CATCH_UP_LATEST) == "LATEST"


def test_concurrency_limits_and_keys(env):
    """``dtq concurrency`` sets, lists, shows and removes a per-key limit; ``enqueue
    --concurrency-key`` stores the key with the task (its active and waiting tasks show
    in ``dtq concurrency keys``)."""
    q = "cli-conc"
    assert env.run("concurrency", "set", q, "2").output.strip() == \
        f"concurrency limit {q}: 2 per key (set)"
    assert env.json("concurrency", "set", q, "3") == {"created": False}
    assert {"queue": q, "max_active_per_key": 3} in env.json("concurrency", "ls")
    for _ in range(2):
        env.run("enqueue", q, "t", "{}", "--concurrency-key", "tenant-7")
    shown = env.json("concurrency", "keys", q)
    assert (shown["max_active_per_key"], shown.get("key_count", 0)) == (3, 0)  # none leased
    table = env.run("concurrency", "keys", q).output
    assert f"{q}: max active per key 3; 0 keys in use" in table
    assert env.run("concurrency", "set", q, "0").exit_code == ExitCode.USAGE
    assert env.run("concurrency", "rm", q).output.strip() == "removed"
    assert env.run("concurrency", "rm", q).output.strip() == "there was no such limit"
    import redis

    r = redis.Redis.from_url(env.gw.redis_url)
    try:
        task_id = env.client.recent_tasks(limit=1)[0].task_id
        assert r.hget(keys.task(task_id), "ckey") == b"tenant-7"
    finally:
        r.close()
