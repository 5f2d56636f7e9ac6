"""The packages type-check: mypy with the configuration of pyproject.toml ([tool.mypy]:
dtq_gateway, dtq_pyworker and dtq_cli; dtq_pyworker with the flags of --strict) finds
no error. ``make lint`` runs the same check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_finds_no_errors():
    pytest.importorskip("mypy", reason="mypy is not installed (pip install -e '.[dev]')")
    run = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary"], cwd=ROOT,
                         check=False,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_public_client_is_checked_strictly(tmp_path):
    """An untyped function in a dtq_pyworker module is an error (checked in place of
    dtq_pyworker/_version.py with --shadow-file; nothing in the package is written)."""
    pytest.importorskip("mypy", reason="mypy is not installed (pip install -e '.[dev]')")
    probe = tmp_path / "probe.py"
    probe.write_text("def untyped(x):\n    return x\n")
    target = "dtq_pyworker/_version.py"
    run = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", target,
                          "--shadow-file", target, str(probe)], cwd=ROOT, check=False,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 1
    assert "Function is missing a type annotation" in run.stdout
