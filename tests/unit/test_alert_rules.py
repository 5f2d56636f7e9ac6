"""deploy/prometheus/dtq-alerts.yml names only metrics and labels the gateway exports.

The rule file is read as YAML; every ``dtq_`` series in an expression must be one
that a collector of :mod:`dtq_gateway.metrics` exposes (counters as ``_total``,
histograms as ``_bucket``/``_count``/``_sum``), every label matcher and ``by (...)``
label must be one of those collectors' labels (or Prometheus's ``job``, ``instance``
and ``le``), and every ``$labels.x`` in an annotation must survive the expression's
aggregation.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.metrics import MetricWrapperBase

from dtq_gateway import metrics

yaml = pytest.importorskip("yaml", reason="PyYAML (dev extra) reads the rule file")

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "dtq-alerts.yml"
#: Labels Prometheus adds itself (target labels, histogram buckets).
PROMETHEUS_LABELS = {"job", "instance", "le"}
SEVERITIES = {"page", "warning", "info"}

SERIES_RE = re.compile(r"\b(dtq_[a-z_]+|up)\s*(\{[^}]*\})?")
MATCHER_RE = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")
BY_RE = re.compile(r"\bby\s*\(([^)]*)\)")
AGGREGATION_RE = re.compile(r"\b(sum|max|min|avg|count)\b")
TEMPLATE_LABEL_RE = re.compile(r"\$labels\.(\w+)")
DURATION_RE = re.compile(r"^\d+[smhd]$")


def exported() -> dict[str, set[str]]:
    """Series name -> label names, for every collector in dtq_gateway.metrics."""
    series: dict[str, set[str]] = {"up": set()}
    for value in vars(metrics).values():
        if not isinstance(value, MetricWrapperBase):
            continue
        # prometheus_client keeps the full name and label names on the collector
        name, labels, kind = value._name, set(value._labelnames), value._type
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}
        for suffix in suffixes.get(kind, [""]):
            series[name + suffix] = labels
    return series


def rules() -> list[dict]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_collectors_are_found() -> None:
    series = exported()
    assert series["dtq_tasks_dead_lettered_total"] == {"queue"}
    assert series["dtq_rpc_duration_seconds_bucket"] == {"method", "code"}
    assert series["dtq_redis_memory_full"] == set()


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r["alert"])
def test_rule_uses_exported_metrics_and_labels(rule: dict) -> None:
    series = exported()
    expr = rule["expr"]
    used = SERIES_RE.findall(expr)
    assert used, f"{rule['alert']}: no metric in {expr!r}"
    labels_in_expr = set(PROMETHEUS_LABELS)
    for name, selector in used:
        assert name in series, f"{rule['alert']}: {name} is not exported by the gateway"
        allowed = series[name] | PROMETHEUS_LABELS
        labels_in_expr |= series[name]
        for label in MATCHER_RE.findall(selector):
            assert label in allowed, f"{rule['alert']}: {name} has no label {label!r}"
    by_labels = {x.strip() for group in BY_RE.findall(expr) for x in group.split(",")
                 if x.strip()}
    assert by_labels <= labels_in_expr, f"{rule['alert']}: by {by_labels - labels_in_expr}"
    kept = by_labels if AGGREGATION_RE.search(expr) else labels_in_expr
    for text in rule.get("annotations", {}).values():
        for label in TEMPLATE_LABEL_RE.findall(text):
            assert label in kept, f"{rule['alert']}: $labels.{label} is aggregated away"


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r["alert"])
def test_rule_shape(rule: dict) -> None:
    assert re.fullmatch(r"Dtq[A-Za-z]+", rule["alert"])
    assert rule["labels"]["severity"] in SEVERITIES
    assert rule["annotations"]["summary"]
    if "for" in rule:
        assert DURATION_RE.match(rule["for"]), rule["for"]
    assert rule["expr"].count("(") == rule["expr"].count(")")


DEPLOY_DOC = RULES.parents[2] / "docs" / "deploy.md"


def test_deploy_doc_lists_the_rules_as_shipped() -> None:
    """docs/deploy.md, Alert rules: its table names exactly the shipped alerts, and a
    missing scheduler leader is alerted on through dtq_scheduler_leader."""
    text = DEPLOY_DOC.read_text()
    section = text.split("## Alert rules", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(Dtq\w+)` \|", section, re.MULTILINE))
    by_name = {rule["alert"]: rule for rule in rules()}
    assert documented == set(by_name)
    assert "dtq_scheduler_leader" in by_name["DtqNoSchedulerLeader"]["expr"]
    assert "sum(dtq_scheduler_leader) == 0" in section
    assert "no metric" not in section
