"""Browser tests: headless Chromium (Debian's ``chromium`` package) driven by Playwright.

The fixture installs what is missing, once per session, so ``make test`` passes on a
fresh machine: ``apt-get install -y chromium`` (after ``apt-get update`` when the
package lists are empty or stale). Playwright's own browser download is never used;
Playwright drives ``/usr/bin/chromium`` through ``executable_path``.

Screenshots go to ``$DTQ_SCREENSHOTS`` or ``tests/artifacts/`` (git-ignored).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"


def _apt(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(["apt-get", *args], capture_output=True, text=True, env=env,
                          timeout=900, check=False)


def _install_chromium() -> None:
    if shutil.which("apt-get") is None:
        pytest.fail(f"{CHROMIUM} is missing and apt-get is not available to install it")
    got = _apt("install", "-y", "-q", "chromium")
    if got.returncode != 0:  # empty or stale package lists
        _apt("update", "-q")
        got = _apt("install", "-y", "-q", "chromium")
    if got.returncode != 0 or not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"apt-get install chromium failed:\n{got.stdout[-2000:]}"
                    f"\n{got.stderr[-2000:]}")


@pytest.fixture(scope="session")
def chromium() -> str:
    """Path of a Chromium that Playwright can drive (installed here when missing)."""
    if not os.access(CHROMIUM, os.X_OK):
        _install_chromium()
    return CHROMIUM


@pytest.fixture(scope="session")
def screenshots() -> Path:
    """Directory for the screenshots the browser tests save."""
    root = Path(__file__).resolve().parents[2]
    path = Path(os.environ.get("DTQ_SCREENSHOTS") or root / "tests" / "artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path
