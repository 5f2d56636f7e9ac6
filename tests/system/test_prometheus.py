"""The alert rules checked by Prometheus itself: ``promtool check rules``, the
``promtool test rules`` unit tests (deploy/prometheus/dtq-alerts.test.yml), and a real
``prometheus`` that scrapes a gateway under load and evaluates every rule, checked
through its HTTP API: every series a rule reads exists, every rule evaluates cleanly.

promtool and prometheus come from Debian's ``prometheus`` package (``make install``
installs it where apt works); without them these tests skip and say so.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.support.leasing import LeaseStream
from tests.support.redis_server import free_port
from tests.unit.test_alert_rules import SERIES_RE, rules

RULES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = RULES_DIR / "dtq-alerts.yml"
RULE_TESTS = RULES_DIR / "dtq-alerts.test.yml"
MISSING = ("{} not found: install Debian's prometheus package (apt-get install "
           "prometheus; make install does so where apt works)")


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(MISSING.format(name))
    return path


def test_promtool_check_rules() -> None:
    out = subprocess.run([tool("promtool"), "check", "rules", str(RULES)],
                         check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules())} rules found" in out.stdout


def test_promtool_rule_unit_tests() -> None:
    out = subprocess.run([tool("promtool"), "test", "rules", str(RULE_TESTS)],
                         check=False, capture_output=True, text=True, timeout=120,
                         cwd=RULES_DIR)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_issue_rule_has_a_unit_test() -> None:
    tested = set()
    for line in RULE_TESTS.read_text().splitlines():
        if "alertname:" in line:
            tested.add(line.split("alertname:")[1].strip())
    assert {"DtqBacklogAging", "DtqDeadLetters", "DtqQueueWithoutWorkers",
            "DtqNoSchedulerLeader", "DtqRedisUnreachable", "DtqRedisNearMaxmemory",
            "DtqLimitRefusals", "DtqGatewayErrorRate"} <= tested
    assert tested <= {r["alert"] for r in rules()}


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.load(resp)


async def _load(gw, channel) -> None:
    """Work that makes every labelled series exist: tasks enqueued, leased, acked and
    dead-lettered, a queue left with a backlog, one Subscribe refused by its bound, one
    background task restarted by the gateway's supervisor."""
    from dtq_proto import dtq_pb2 as pb
    from dtq_proto import dtq_pb2_grpc

    broker = dtq_pb2_grpc.BrokerStub(channel)
    events = dtq_pb2_grpc.EventsStub(channel)
    await broker.EnqueueBatch(pb.EnqueueBatchRequest(items=[
        pb.EnqueueRequest(queue="load", task_type="t") for _ in range(100)]))
    await broker.Enqueue(pb.EnqueueRequest(queue="waiting", task_type="t"))
    lease = await LeaseStream(broker, "w-load", ["load"], max_in_flight=10).open()
    task = await lease.next()  # the first one dead-letters (not retryable)
    await broker.Fail(pb.FailRequest(items=[pb.FailItem(
        lease_id=task.lease_id, error_message="boom", retryable=False)]))
    for _ in range(99):
        task = await lease.next()
        await broker.Ack(pb.AckRequest(items=[pb.AckItem(lease_id=task.lease_id)]))
    lease.close()
    first = events.Subscribe(pb.SubscribeRequest())
    second = events.Subscribe(pb.SubscribeRequest())
    with pytest.raises(Exception):  # noqa: B017 - RESOURCE_EXHAUSTED over the bound
        await asyncio.wait_for(second.read(), 10)
    first.cancel()
    ended = gw.supervisor.task("metrics-refresh")
    ended.cancel()
    deadline = asyncio.get_running_loop().time() + 10
    while gw.supervisor.task("metrics-refresh") is ended:  # restarted after its backoff
        assert asyncio.get_running_loop().time() < deadline, "no restart"
        await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_prometheus_scrapes_a_gateway_and_finds_every_rule_series(redis_url) -> None:
    import grpc

    from dtq_gateway.server import Gateway
    from tests.conftest import gateway_settings

    binary = tool("prometheus")
    metrics_port, web_port = free_port(), free_port()
    gw = Gateway(gateway_settings(redis_url, metrics_port=metrics_port,
                                  metrics_host="127.0.0.1", events_max_subscribers=1),
                 redis_url)
    await gw.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}")
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "prometheus.yml"
        shutil.copy(RULES, Path(tmp) / RULES.name)
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: [{RULES.name}]\n"
            "scrape_configs:\n  - job_name: dtq-gateway\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]\n")
        proc = await asyncio.create_subprocess_exec(
            binary, f"--config.file={config}", f"--storage.tsdb.path={tmp}/data",
            f"--web.listen-address=127.0.0.1:{web_port}",
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            await _load(gw, channel)
            await _wait_for_every_series(f"http://127.0.0.1:{web_port}")
        finally:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 30)
            await channel.close()
            await gw.stop()


async def _wait_for_every_series(base: str, timeout_s: float = 90.0) -> None:
    """Poll Prometheus until every series the rules read has samples and every rule
    was evaluated without error; fail naming what is missing."""
    wanted = {name for r in rules() for name, _ in SERIES_RE.findall(r["expr"])}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    missing: set[str] = set(wanted)
    unhealthy: list[str] = ["(rules not read yet)"]
    while loop.time() < deadline:
        try:
            missing = set()
            for name in sorted(wanted):
                query = urllib.parse.urlencode({"query": f'{name}{{job="dtq-gateway"}}'})
                reply = await asyncio.to_thread(_get, f"{base}/api/v1/query?{query}")
                if not reply["data"]["result"]:
                    missing.add(name)
            groups = (await asyncio.to_thread(_get, f"{base}/api/v1/rules"))["data"]["groups"]
            evaluated = [r for g in groups for r in g["rules"]]
            unhealthy = [f"{r['name']}: {r.get('lastError')}" for r in evaluated
                         if r.get("health") != "ok"]
            if len(evaluated) != len(rules()):
                unhealthy.append(f"{len(evaluated)} rules loaded of {len(rules())}")
        except OSError:  # Prometheus still starting
            pass
        if not missing and not unhealthy:
            return
        await asyncio.sleep(1.0)
    raise AssertionError(f"series without samples: {sorted(missing)}; rules: {unhealthy}")
