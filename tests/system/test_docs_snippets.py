"""The docs' commands run as written, and every DTQ_* variable they name exists.

Shell blocks of README.md, docs/*.md and examples/*/README.md that follow the marker
line ``<!-- doc-check: run -->`` are run with bash (``set -euo pipefail``) from the
repository root against a private gateway on a private redis-server: the default
addresses the docs use (``localhost:50051``, ``127.0.0.1:50051``, metrics on
``:9464``) are pointed at it, ``DTQ_GATEWAY`` names it, and ``.venv/bin/`` is the
bin directory of the Python running the tests. Each block must exit 0. Blocks with
placeholders (``<id>``), endless streams or long runs stay unmarked.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.redis_server import RedisServer, free_port

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
MARKER = "<!-- doc-check: run -->"
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
               *(ROOT / "examples").glob("*/README.md")])
BLOCK_TIMEOUT_S = 30
POLL_S = 0.05  # health poll interval, bounded by the start deadline


@dataclasses.dataclass(frozen=True)
class Snippet:
    """One marked shell block: where it is and its text."""

    doc: Path
    line: int
    text: str

    @property
    def id(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def marked_snippets(doc: Path) -> list[Snippet]:
    """The fenced ``sh`` blocks that follow a marker line in ``doc``."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.strip() != MARKER:
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        assert j < len(lines) and lines[j].strip() in ("```sh", "```bash"), \
            f"{doc.name}:{i + 1}: {MARKER} must precede a ```sh block"
        end = lines.index("```", j + 1)
        out.append(Snippet(doc, j + 2, "\n".join(lines[j + 1:end])))
    return out


SNIPPETS = [s for doc in DOCS for s in marked_snippets(doc)]


@dataclasses.dataclass
class DocGateway:
    """A dtq-gateway process on a private redis-server."""

    address: str
    metrics: str
    env: dict[str, str]


@pytest.fixture(scope="module")
def doc_gateway(tmp_path_factory) -> Iterator[DocGateway]:
    redis = RedisServer(appendonly=False).start()
    port, mport = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTQ_")}
    env.update(DTQ_REDIS_URL=redis.url, DTQ_LISTEN=f"127.0.0.1:{port}",
               DTQ_METRICS_PORT=str(mport), DTQ_LOG_FORMAT="text",
               PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    log = (tmp_path_factory.mktemp("docs") / "gateway.log").open("w")
    proc = subprocess.Popen([str(BIN / "dtq-gateway")], env=env, cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        address = f"127.0.0.1:{port}"
        _wait_serving(address, proc)
        _seed(address)
        run_env = {k: v for k, v in env.items() if k != "DTQ_REDIS_URL"}
        run_env.update(DTQ_GATEWAY=address, PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
        yield DocGateway(address, f"127.0.0.1:{mport}", run_env)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        redis.cleanup()


def _wait_serving(address: str, proc: subprocess.Popen, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            assert proc.poll() is None, "dtq-gateway exited"
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == \
                        health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            assert time.monotonic() < deadline, "dtq-gateway never served"
            time.sleep(POLL_S)


def _seed(address: str) -> None:
    """The queue the docs' examples name ("demo", "emails") exist with a task each."""
    from dtq_pyworker import Client

    with Client(address) as client:
        for queue in ("demo", "emails"):
            client.enqueue(queue, "doc.example", {"n": 1})


def localize(text: str, gw: DocGateway) -> str:
    """Point the docs' default addresses and ``.venv/bin/`` at the private setup."""
    for default in ("localhost:50051", "127.0.0.1:50051"):
        text = text.replace(default, gw.address)
    for default in ("localhost:9464", "127.0.0.1:9464"):
        text = text.replace(default, gw.metrics)
    return text.replace(".venv/bin/", f"{BIN}/")


@pytest.mark.slow
@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.id for s in SNIPPETS])
def test_marked_doc_snippet_runs(snippet: Snippet, doc_gateway: DocGateway) -> None:
    if re.search(r"(^|[|;&(]\s*)curl ", snippet.text, re.MULTILINE) and not shutil.which("curl"):
        pytest.skip("curl is not installed")
    script = "set -euo pipefail\n" + localize(snippet.text, doc_gateway)
    proc = subprocess.run(["bash", "-c", script], cwd=ROOT, env=doc_gateway.env,
                          capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S, check=False)
    assert proc.returncode == 0, (
        f"{snippet.id} failed (exit {proc.returncode}):\n{script}\n"
        f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")


def test_the_docs_mark_runnable_snippets() -> None:
    assert {s.doc.name for s in SNIPPETS} >= {"README.md", "operations.md"}


# ---- every DTQ_* variable the docs name exists ----

#: Where a DTQ_* name may be defined: gateway settings (below), the Python worker and
#: client, the example workers and demo, the conformance suite's runner.
CODE_DIRS = ("dtq_pyworker", "dtq_cli", "examples", "tests/conformance", "tests/browser")
VAR_RE = re.compile(r"\bDTQ_[A-Z0-9]+(?:_[A-Z0-9]+)*\b")


def documented_variables() -> dict[str, str]:
    """DTQ_* names written in the docs -> the first file naming each."""
    found: dict[str, str] = {}
    for doc in DOCS:
        for name in VAR_RE.findall(doc.read_text(encoding="utf-8")):
            found.setdefault(name, str(doc.relative_to(ROOT)))
    return found


def known_variables() -> set[str]:
    from dtq_gateway.settings import Settings, env_name

    known = {env_name(f.name) for f in dataclasses.fields(Settings)}
    for top in CODE_DIRS:
        for folder, dirs, files in os.walk(ROOT / top):
            dirs[:] = [d for d in dirs if d not in ("node_modules", "__pycache__")]
            for name in files:
                if name.endswith((".py", ".js", ".mjs")):
                    text = (Path(folder) / name).read_text(encoding="utf-8", errors="replace")
                    known.update(VAR_RE.findall(text))
    # a Secret key that one shipped manifest defines and another reads (the KEDA
    # trigger's tokenFromEnv) is defined there, not in Python
    manifests = Counter(name for manifest in (ROOT / "deploy" / "kubernetes").glob("*.yaml")
                        for name in VAR_RE.findall(manifest.read_text(encoding="utf-8")))
    known.update(name for name, uses in manifests.items() if uses >= 2)
    return known


def test_every_dtq_variable_in_the_docs_exists_in_the_code() -> None:
    unknown = {name: where for name, where in documented_variables().items()
               if name not in known_variables()}
    assert not unknown, f"DTQ_* variables the docs name but no code reads: {unknown}"


def test_every_auth_tokens_example_in_the_docs_is_accepted() -> None:
    from dtq_gateway.rpc.auth import parse_tokens

    examples = [(doc.name, m.group(1)) for doc in DOCS
                for m in re.finditer(r"DTQ_AUTH_TOKENS='([^']+)'", doc.read_text("utf-8"))]
    assert examples, "no DTQ_AUTH_TOKENS='...' example found in the docs"
    for where, spec in examples:
        try:
            assert parse_tokens(spec), where
        except ValueError as exc:
            pytest.fail(f"{where}: DTQ_AUTH_TOKENS example refused at startup: {exc}")


def test_configuration_doc_lists_every_worker_flag_and_variable() -> None:
    from dtq_pyworker.cli import build_parser

    doc = (ROOT / "docs" / "configuration.md").read_text("utf-8")
    section = doc[doc.index("## Python worker"):doc.index("## Demo")]
    missing = []
    for action in build_parser()._actions:
        flags = [f for f in action.option_strings if f.startswith("--") and f != "--help"]
        missing += [f for f in flags if f"`{f}" not in section]
        missing += [v for v in VAR_RE.findall(action.help or "") if f"`{v}`" not in section]
    cli_doc = (ROOT / "dtq_pyworker" / "cli.py").read_text("utf-8").split('"""')[1]
    missing += [v for v in VAR_RE.findall(cli_doc) if f"`{v}`" not in section]
    assert not missing, f"dtq-pyworker flags/variables not in docs/configuration.md: {missing}"


@pytest.mark.slow
def test_readme_handler_and_producer_run_as_written(doc_gateway: DocGateway, tmp_path) -> None:
    """README's "Ten lines of dtq": handlers.py under dtq-pyworker, then the producer."""
    readme = (ROOT / "README.md").read_text("utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
    handlers = next(b for b in blocks if "# handlers.py" in b)
    producer = next(b for b in blocks if "Client(" in b)
    (tmp_path / "handlers.py").write_text(handlers)
    (tmp_path / "producer.py").write_text(localize(producer, doc_gateway))
    worker = subprocess.Popen([str(BIN / "dtq-pyworker"), "handlers:worker"], cwd=tmp_path,
                              env=doc_gateway.env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        proc = subprocess.run([sys.executable, "producer.py"], cwd=tmp_path,
                              env=doc_gateway.env, capture_output=True, text=True,
                              timeout=BLOCK_TIMEOUT_S, check=False)
    finally:
        worker.terminate()
        out, _ = worker.communicate(timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "sent" in proc.stdout and "true" in proc.stdout.lower()
    assert worker.returncode == 0 and "mail to ada@example.com" in out
