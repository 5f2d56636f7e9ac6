"""The demo: its pure parts, then the workload end to end with real processes.

The system test runs ``python -m examples.demo`` on a few dozen files: a real
gateway against a private redis-server (``DTQ_REDIS_URL``), two ``dtq-pyworker``
processes and the producer. Afterwards Redis must hold only key families of the
layout table, and the band streams must be empty (ack deletes the entry, it does
not just XACK it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis

from dtq_gateway.store import keys
from dtq_proto import dtq_pb2
from examples.demo import summary as demo_summary
from examples.demo.producer import plan, priority_of, stdlib_files
from examples.demo.textstats import file_stats
from tests.support.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
FILES = 30
#: Families that carry a TTL (the rest are bounded by trimming or cleaned as they go).
_EXPIRING = {"task", "result", "idempotency", "worker", "scheduler-lock", "gateway",
             "history"}
_GATEWAY_TAG_RE = re.compile(r"^[0-9a-f]{16}\Z")


def key_family(key: str) -> str | None:
    """The layout-table family of ``key``, or None when the table has no such key.

    Every candidate is rebuilt with the builders of ``dtq_gateway.store.keys`` and
    compared, so this test spells no key names of its own.
    """
    if keys.parse_stream(key) is not None:
        return "band-stream"
    singles = {keys.AUDIT: "audit", keys.RETRY_CLAIMED: "retry-claimed",
               keys.WORKERS: "workers", keys.DEAD_LETTER_QUEUES: "dead-letter-queues",
               keys.RECENT_TASKS: "recent-tasks", keys.SCHEDULER_LOCK: "scheduler-lock",
               keys.BUSY_QUEUES: "busy-queues", keys.QUEUES: "queue-registry",
               keys.QUEUES_BACKFILLED: "registry-backfilled", keys.LEASE_SECRET: "lease-secret",
               keys.HISTORY: "history"}
    if key in singles:
        return singles[key]
    for family, build, pattern in (("task", keys.task, keys.TASK_ID_RE),
                                   ("result", keys.result, keys.TASK_ID_RE),
                                   ("worker", keys.worker, keys.WORKER_ID_RE),
                                   ("gateway", keys.gateway, _GATEWAY_TAG_RE)):
        ident = key.rsplit(":", 1)[-1]
        if pattern.match(ident) and key == build(ident):
            return family
    parts = key.split(":")
    tag = parts[2][1:-1] if len(parts) >= 3 and len(parts[2]) > 2 else ""
    if len(parts) == 4 and key == keys.idempotency(tag, parts[3]):
        return "idempotency"
    for family, build in (("paused", keys.paused), ("busy-marker", keys.busy_marker),
                          ("dead-letter", keys.dead_letter), ("retry-schedule", keys.schedule),
                          ("queue-counters", keys.queue_counters), ("history", keys.history)):
        if keys.QUEUE_RE.match(tag) and key == build(tag):
            return family
    if len(parts) == 3 and keys.QUEUE_RE.match(tag) and key == keys.cancelled(tag):
        return "cancelled"
    return None


def run_demo(redis_url: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    """Run the demo on FILES files with private ports; return the process and JSON summary."""
    env = dict(os.environ, DTQ_REDIS_URL=redis_url,
               DTQ_LISTEN=f"127.0.0.1:{free_port()}", DTQ_METRICS_PORT=str(free_port()))
    env.pop("DTQ_GATEWAY", None)
    summary_path = tmp_path / "summary.json"
    cmd = [sys.executable, "-m", "examples.demo", "--files", str(FILES), "--no-node",
           "--timeout", "60", "--json", str(summary_path), "--log-dir", str(tmp_path / "logs")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
                          check=False)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                     for p in sorted((tmp_path / "logs").glob("*.log")))
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{logs}"
    return proc, json.loads(summary_path.read_text())


@pytest.mark.system
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
        dead = sum(client.xlen(k) for k, fam in found.items() if fam == "dead-letter")
        assert dead == summary["dead_lettered"]
    finally:
        client.close()


def test_file_stats_counts_lines_words_and_hashes_bytes(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_bytes(b"def f(x):\n    return x_1 + X_1  # \xff\n")
    stats = file_stats(str(path), top_n=2)
    assert stats["lines"] == 2
    assert stats["words"] == 6  # def f x return x_1 x_1 (lower-cased)
    assert stats["top_words"] == [["x_1", 2], ["def", 1]]
    assert stats["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_plan_has_one_stats_task_per_file_and_the_failing_kinds() -> None:
    files = stdlib_files(limit=40)
    specs = plan(files, flaky=4, poison=2, corrupt=1)
    by_type = [s.task_type for s in specs]
    assert by_type.count("file.stats") == 40 and [s.payload["path"] for s in specs[:40]] == files
    assert (by_type.count("file.flaky"), by_type.count("file.poison"),
            by_type.count("file.corrupt")) == (4, 2, 1)
    assert [s.payload["fail_attempts"] for s in specs if s.task_type == "file.flaky"] == [1, 2, 1, 2]
    assert all(s.max_attempts == 2 for s in specs if s.task_type == "file.poison")
    assert {s.priority for s in specs} <= set(range(10)) and len({s.priority for s in specs}) > 5
    assert priority_of(files[0]) == priority_of(files[0])  # stable across calls (crc32)
    req = specs[-2].to_request()  # a poison task
    assert (req.queue, req.retry_policy.backoff_base_ms) == ("demo", 50)


def _task(status: int, created: int, starts: list[int], finished: int,
          result: dict | None = None, worker_id: str = "") -> dtq_pb2.Task:
    task = dtq_pb2.Task(status=status, created_at_ms=created, finished_at_ms=finished,
                        worker_id=worker_id)
    for n, start in enumerate(starts, 1):
        task.attempts.add(attempt=n, started_at_ms=start)
    if result is not None:
        task.result = json.dumps(result).encode()
    return task


def test_summary_counts_outcomes_retries_waits_and_words() -> None:
    ok = dtq_pb2.TASK_STATUS_SUCCEEDED
    result = {"lines": 3, "words": 5, "worker_lang": "python", "top_words": [["self", 4]]}
    tasks = {
        "a": _task(ok, 1000, [1010], 1100, result),
        "b": _task(ok, 1000, [1030, 1200], 1300, dict(result, worker_lang=""), "n1"),
        "c": _task(dtq_pb2.TASK_STATUS_DEAD_LETTERED, 1000, [1020], 1500),
        "d": _task(dtq_pb2.TASK_STATUS_SCHEDULED, 1000, [1040], 0),
    }
    types = {"a": "file.stats", "b": "file.flaky", "c": "file.corrupt", "d": "file.poison",
             "e": "file.stats"}
    s = demo_summary.build(tasks, types, {"n1": "node"})  # b's result names no language
    assert (s.tasks, s.succeeded, s.dead_lettered, s.left_open) == (5, 2, 1, 2)
    assert s.open_by_status == {"SCHEDULED": 1, "MISSING": 1}
    assert (s.retried_tasks, s.retries) == (1, 1)
    assert (s.queue_wait_p50_ms, s.queue_wait_p99_ms) == (20, 40)
    assert s.per_lang == {"python": 1, "node": 1}
    assert (s.files, s.lines, s.words, s.top_words) == (1, 3, 5, [("self", 4)])
    assert s.elapsed_s == 0.5 and s.throughput_per_s == 6.0
    assert "left queued or active: 2 (SCHEDULED 1, MISSING 1)" in demo_summary.render(s)


def test_key_family_knows_the_layout_and_nothing_else() -> None:
    task_id = keys.new_task_id("demo")
    assert key_family(keys.stream("demo", 3)) == "band-stream"
    assert key_family(keys.task(task_id)) == "task"
    assert key_family(keys.result(task_id)) == "result"
    assert key_family(keys.worker("w-1")) == "worker"
    assert key_family(keys.idempotency("demo", keys.idempotency_digest("k"))) == "idempotency"
    assert key_family(keys.paused("demo")) == "paused"
    assert key_family(keys.dead_letter("demo")) == "dead-letter"
    assert key_family(keys.cancelled("demo")) == "cancelled"
    assert key_family(keys.schedule("demo")) == "retry-schedule"
    assert key_family(keys.history("demo")) == key_family(keys.HISTORY) == "history"
    assert key_family(keys.task("not-a-task-id")) is None
    assert key_family(keys.PREFIX + "something:else") is None


def test_readme_and_configuration_doc_carry_the_current_settings_table() -> None:
    proc = subprocess.run([sys.executable, "scripts/gen_config_doc.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


async def test_enqueue_resends_unavailable_items_with_the_same_keys() -> None:
    """A primary failing over answers its items UNAVAILABLE while the others are taken:
    the demo resends just those, under the same idempotency keys (no second task)."""
    from examples.demo import producer

    sent: list[list[tuple[str, str]]] = []

    class Stub:
        async def EnqueueBatch(self, request, timeout):
            sent.append([(i.task_type, i.idempotency_key) for i in request.items])
            results = []
            for n, item in enumerate(request.items):
                if len(sent) == 1 and n == 0:
                    results.append(dtq_pb2.EnqueueBatchResult(error=dtq_pb2.ItemError(
                        code=14, reason="REDIS_UNAVAILABLE")))
                else:
                    results.append(dtq_pb2.EnqueueBatchResult(task_id=f"id-{item.idempotency_key}"))
            return dtq_pb2.EnqueueBatchResponse(results=results)

    specs = [producer.TaskSpec("file.stats", {"path": f"/f{i}"}, 5) for i in range(3)]
    accepted, errors = await producer.enqueue_all(Stub(), specs, lambda batch: None)
    assert errors == [] and len(accepted) == 3
    assert len(sent) == 2 and sent[1] == [sent[0][0]]  # only the refused item, same key
    assert len({key for _, key in sent[0]}) == 3


_COMPLAINT_RE = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b")


def _marked_pids(marker: str) -> list[int]:
    """Live processes whose environment carries DTQ_TEST_MARKER=marker (the demo, its
    gateway and workers, and the gateway's embedded redis-server inherit it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if f"DTQ_TEST_MARKER={marker}".encode() in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def _slow_redis_server(directory: Path, delay_s: float) -> Path:
    """A ``redis-server`` for PATH that waits ``delay_s`` before it becomes the real one
    (one process, exec): an embedded Redis that takes long to start, as with a long
    AOF to replay."""
    from tests.support.redis_server import redis_server_binary

    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "redis-server"
    script.write_text(f"#!{sys.executable}\nimport os, sys, time\ntime.sleep({delay_s})\n"
                      f"os.execv({redis_server_binary()!r}, "
                      f"[{redis_server_binary()!r}, *sys.argv[1:]])\n")
    script.chmod(0o755)
    return directory


def _start_demo(tmp_path: Path, path_first: Path | None = None
                ) -> tuple[subprocess.Popen[str], str]:
    """The demo on every stdlib file with an embedded Redis, as a terminal runs it: in a
    process group of its own, which Ctrl-C signals as a whole."""
    marker = uuid.uuid4().hex
    env = dict(os.environ, DTQ_LISTEN=f"127.0.0.1:{free_port()}",
               DTQ_METRICS_PORT=str(free_port()), DTQ_EMBEDDED_DIR=str(tmp_path / "redis"),
               DTQ_TEST_MARKER=marker)
    if path_first is not None:
        env["PATH"] = f"{path_first}{os.pathsep}{env.get('PATH', '')}"
    for name in ("DTQ_REDIS_URL", "DTQ_GATEWAY"):
        env.pop(name, None)
    cmd = [sys.executable, "-m", "examples.demo", "--no-node", "--timeout", "120",
           "--log-dir", str(tmp_path / "logs")]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    return proc, marker


def _wait_until(check, proc: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if check():
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    pytest.fail(f"never happened: {what}")


def _log_has(path: Path, text: str) -> bool:
    return path.exists() and text in path.read_text(errors="replace")


def _ctrl_c(proc: subprocess.Popen[str], marker: str, log_dir: Path) -> str:
    """SIGINT to the demo's process group (what Ctrl-C does); then the demo must exit
    130 within a few seconds, stop its children (none killed, none logging a warning
    or a traceback), print no traceback and leave no process behind. Returns its
    stdout."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        started = time.monotonic()
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the demo did not exit within 60 s of Ctrl-C")
        elapsed = time.monotonic() - started
        logs = {p.name: p.read_text(errors="replace") for p in log_dir.glob("*.log")}
        assert proc.returncode == 130, f"{out}\n{err}\n{logs}"
        assert elapsed < 8, f"{elapsed}\n{out}\n{err}"
        assert "Traceback" not in out + err, f"{out}\n{err}"
        assert [name for name, text in logs.items() if "Traceback" in text] == []
        # stopped in order, each while what it needs still runs: workers while the
        # gateway takes their results, the gateway while its Redis answers
        complaints = [line for text in logs.values() for line in text.splitlines()
                      if _COMPLAINT_RE.search(line)]
        assert complaints == []
        assert "demo: interrupted" in err and "had to kill" not in err, err
        deadline = time.monotonic() + 10
        while _marked_pids(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                for pid in _marked_pids(marker)}
        assert left == {}
        return out
    finally:
        for pid in _marked_pids(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.system
def test_ctrl_c_while_the_embedded_redis_starts_stops_everything_quickly(
        tmp_path: Path) -> None:
    slow = _slow_redis_server(tmp_path / "bin", delay_s=5.0)
    proc, marker = _start_demo(tmp_path, path_first=slow)
    log_dir = tmp_path / "logs"
    # the gateway's first line: it is starting its (slow) embedded redis-server now
    _wait_until(lambda: _log_has(log_dir / "gateway.log", "starting embedded redis-server"),
                proc, "the gateway starts its embedded Redis")
    out = _ctrl_c(proc, marker, log_dir)
    assert "gateway:" not in out  # interrupted before the gateway was ready
    assert "exit codes gateway 0;" in out  # SIGTERM while starting Redis: a clean exit


@pytest.mark.system
def test_ctrl_c_mid_demo_stops_everything_quickly(tmp_path: Path) -> None:
    proc, marker = _start_demo(tmp_path)
    log_dir = tmp_path / "logs"
    _wait_until(lambda: _log_has(log_dir / "pyworker-1.log", "lease session open"), proc,
                "a worker is connected")
    first = json.loads((log_dir / "gateway.log").read_text().splitlines()[0])
    client = redis.Redis.from_url(first["url"])
    try:  # mid-run: tasks are queued and being worked on
        _wait_until(lambda: sum(1 for _ in client.scan_iter(match=keys.result("*"),
                                                             count=1000)) >= 100,
                    proc, "100 tasks done")
    finally:
        client.close()
    out = _ctrl_c(proc, marker, log_dir)
    assert "dtq demo summary" not in out  # interrupted before the workload finished
