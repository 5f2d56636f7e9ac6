"""The "Running on Kubernetes" sections of docs/deploy.md and docs/operations.md say
what the code and the files do: the manifest table names the objects of
deploy/kubernetes/, the trigger metadata table the scaler's metrics, defaults and
bound, the alert runbook every rule of dtq-alerts.yml and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dtq_gateway.rpc import keda_scaler

yaml = pytest.importorskip("yaml", reason="PyYAML (dev extra) reads the files")

ROOT = Path(__file__).resolve().parents[2]


def section(doc: str, title: str) -> str:
    text = (ROOT / "docs" / doc).read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def table_rows(text: str, header: str) -> list[list[str]]:
    """The rows of the markdown table whose header line starts with ``header``."""
    lines = text[text.index(header):].splitlines()
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split(" | ")])
    return rows


def test_manifest_table_names_the_files_and_objects() -> None:
    rows = table_rows(section("deploy.md", "Running on Kubernetes"), "| file | objects |")
    docs_ = {}
    for path in (ROOT / "deploy" / "kubernetes").glob("*.yaml"):
        docs_[path.name] = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert sorted(r[0].strip("`") for r in rows) == sorted(docs_)
    for file, objects, *_ in rows:
        for d in docs_[file.strip("`")]:
            assert f"{d['kind']} `{d['metadata']['name']}`" in objects, (file, d["kind"])


def test_trigger_metadata_table_matches_the_scaler() -> None:
    text = section("deploy.md", "Running on Kubernetes")
    rows = {r[0]: r for r in table_rows(text, "| key | meaning | default |")}
    metrics = re.findall(r"`(\w+)`", rows["`metric`"][1])
    assert metrics == list(keda_scaler.DEFAULT_TARGETS)
    assert f"up to {keda_scaler.MAX_QUEUES} " in rows["`queue` or `queues`"][1]
    defaults = keda_scaler.DEFAULT_TARGETS
    assert rows["`target`"][2] == (f"{defaults['backlog']:g} (backlog, leased_plus_waiting), "
                                   f"{defaults['backlog_age']:g} (backlog_age)")
    assert defaults["backlog"] == defaults["leased_plus_waiting"]
    ops = section("operations.md", "Running on Kubernetes")
    assert f"at most {keda_scaler.MAX_QUEUES} queues" in ops
    assert f"(at most every {keda_scaler.STREAM_MIN_RECHECK_S:g} s) and every " \
           f"{keda_scaler.STREAM_RECHECK_S:g} s otherwise" in ops
    assert [r[0].strip("`") for r in table_rows(ops, "| metric | value |")] == metrics


def test_runbook_covers_every_alert_rule() -> None:
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "dtq-alerts.yml").read_text())
    names = [r["alert"] for g in rules["groups"] for r in g["rules"]]
    rows = table_rows(section("operations.md", "Running on Kubernetes"), "| alert | means |")
    assert sorted(r[0].strip("`") for r in rows) == sorted(names)
    assert all(r[1] and r[2] for r in rows)
