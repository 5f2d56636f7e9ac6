"""The Go client (clients/go) beyond the conformance suite: its own unit tests on an
in-process fake gateway, its Client (producer) against a real gateway on a private
Redis, and its demo handlers against the Python ones. Skipped, with one line, where
Go or the vendored Debian packages are missing (make install provides both)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dtq_pyworker import PermanentError
from examples.demo.textstats import file_stats
from tests.conformance.client import ConformanceClient
from tests.conformance.conftest import GO_WORKER_BIN
from tests.conformance.processes import REPO_ROOT, Gateway, Worker
from tests.support.redis_server import RedisServer, free_port
from tests.support.threaded_gateway import ThreadedGateway

GO_CLIENT = REPO_ROOT / "clients" / "go"
QUEUE = "go-producer"


def _go() -> str:
    """Path of the go command; skips the test where Go or the vendor dir is missing."""
    go = shutil.which("go")
    if go is None or not (GO_CLIENT / "vendor" / "modules.txt").is_file():
        pytest.skip("go or clients/go/vendor missing: make install sets both up where "
                    "Debian's Go packages can be installed (clients/go/README.md)")
    return go


def _go_test(go: str, run: str, extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTQ_")}
    env.update(extra_env, GOFLAGS="-mod=vendor")
    return subprocess.run([go, "test", "-count=1", "-v", "-run", run, "."], cwd=GO_CLIENT,
                          env=env, check=False, capture_output=True, text=True, timeout=300)


def _echo(payload, ctx):
    return {"echo": payload}


def _boom(payload, ctx):
    raise PermanentError("kaput")


def test_go_worker_unit_tests_pass() -> None:
    units = ("TestWorker|TestDrain|TestCancelled|TestTimeout|TestPermanent|TestHandler|TestStuck"
             "|TestUnanswered|TestConfigFromEnv")
    proc = _go_test(_go(), units, {})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.stdout.count("--- PASS") == 11 and "--- FAIL" not in proc.stdout, proc.stdout


def test_go_producer_enqueues_and_waits_against_a_gateway() -> None:
    go = _go()
    server = RedisServer(appendonly=False).start()
    gw = ThreadedGateway(server.url).start()
    try:
        gw.run_worker([QUEUE], {"ok": _echo, "boom": _boom}, worker_id="w-go-producer")
        proc = _go_test(go, "TestProducer", {"DTQ_TEST_GATEWAY": gw.target,
                                             "DTQ_TEST_QUEUE": QUEUE})
    finally:
        gw.stop()
        server.cleanup()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "--- PASS: TestProducer " in proc.stdout and "SKIP" not in proc.stdout, proc.stdout
    assert proc.stdout.count("    --- PASS") == 5, proc.stdout


def test_go_demo_handler_counts_files_like_the_python_one(tmp_path: Path) -> None:
    if not GO_WORKER_BIN.is_file():
        pytest.skip("clients/go/bin/dtq-conformance-worker missing: make install builds it")
    odd = tmp_path / "odd.txt"
    odd.write_bytes(b"def f(x):\n    return x_1 + X_1  # \xff\nno newline at the end")
    paths = [str(odd), str(REPO_ROOT / "dtq_gateway" / "settings.py"), json.__file__]
    server = RedisServer(appendonly=False).start()
    gw = ThreadedGateway(server.url).start()
    worker = Worker(f"exec {GO_WORKER_BIN}", "w-go-demo", tmp_path,
                    {"DTQ_GATEWAY": gw.target, "DTQ_QUEUES": "go-demo"}).start()
    client = ConformanceClient(gw.target)
    try:
        ids = [client.enqueue("go-demo", "file.stats", {"path": p}) for p in paths]
        tasks = client.wait_all_terminal(ids, 30)
    finally:
        client.close()
        worker.kill()
        gw.stop()
        server.cleanup()
    for path, task in zip(paths, tasks, strict=True):
        assert task.status == 4, worker.output()  # SUCCEEDED
        assert json.loads(task.result) == {**file_stats(path), "worker_lang": "go"}


def test_go_worker_bench_prints_a_row_beside_the_python_worker(
        capsys: pytest.CaptureFixture[str]) -> None:
    from bench import go_worker

    if not go_worker.GO_BENCH_WORKER.is_file():
        pytest.skip("clients/go/bin/dtq-bench-worker missing: make install builds it")
    assert go_worker.main(["--tasks", "200", "--concurrency", "8"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()
            if line.startswith(("python ", "go "))}
    assert set(rows) == {"python", "go"} and all(len(v) == 4 for v in rows.values()), out


def _granted_max_batch(address: str, queue: str) -> int:
    """SessionInfo.max_batch that the gateway grants a session asking for 16 (0: none)."""
    import grpc

    from dtq_proto import dtq_pb2, dtq_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stream = dtq_pb2_grpc.BrokerStub(channel).Lease(dtq_pb2.LeaseRequest(
            worker_id="probe-max-batch", queues=[queue], max_in_flight=1, max_batch=16))
        try:
            return next(stream).session.max_batch
        finally:
            stream.cancel()


def test_go_worker_takes_batched_delivery(gateway: Gateway, client: ConformanceClient,
                                          queue: str, tmp_path: Path) -> None:
    if not GO_WORKER_BIN.is_file():
        pytest.skip("clients/go/bin/dtq-conformance-worker missing: make install builds it")
    if _granted_max_batch(gateway.address, f"{queue}-probe") <= 1:
        pytest.skip("this gateway grants no LeaseRequest.max_batch (it predates the field)")
    ids = [client.enqueue(queue, "conf.echo", {"i": i}) for i in range(64)]
    worker = Worker(f"exec {GO_WORKER_BIN}", "w-go-batch", tmp_path, {
        "DTQ_GATEWAY": gateway.address, "DTQ_QUEUES": queue, "DTQ_CONCURRENCY": "8",
        "DTQ_MAX_IN_FLIGHT": "16", "DTQ_MAX_BATCH": "16"}).start()
    try:
        tasks = client.wait_all_terminal(ids, 30)
        assert worker.terminate_and_wait(30) == 0, worker.output()
    finally:
        worker.kill()
    assert all(t.status == 4 and t.attempt == 1 for t in tasks), worker.output()  # SUCCEEDED
    stats = json.loads(worker.stdout_path.read_text().strip().splitlines()[-1])
    assert stats["processed"] == 64 and stats["batches"] >= 1, stats


def test_demo_with_go_runs_on_the_go_worker(tmp_path: Path) -> None:
    if not GO_WORKER_BIN.is_file():
        pytest.skip("clients/go/bin/dtq-conformance-worker missing: make install builds it")
    server = RedisServer(appendonly=False).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTQ_")}
    env.update(DTQ_REDIS_URL=server.url, DTQ_LISTEN=f"127.0.0.1:{free_port()}",
               DTQ_METRICS_PORT=str(free_port()))
    summary_path = tmp_path / "summary.json"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "examples.demo", "--files", "10", "--no-node", "--go",
             "--workers", "0", "--timeout", "60", "--json", str(summary_path),
             "--log-dir", str(tmp_path / "logs")],
            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=180, check=False)
    finally:
        server.cleanup()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "a Go worker joins" in proc.stdout
    summary = json.loads(summary_path.read_text())
    assert summary["left_open"] == 0 and summary["succeeded"] > 0
    assert summary["per_lang"] == {"go": summary["succeeded"]}
