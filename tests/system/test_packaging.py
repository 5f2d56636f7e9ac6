"""Packaging: building dtq prints no warnings and ships every Lua script."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("dtq_gateway", "dtq_pyworker", "dtq_proto", "dtq_cli")


@pytest.mark.slow
def test_wheel_builds_without_warnings_and_ships_the_lua_scripts(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    # the build backend of the running environment: no download, same setuptools as
    # `make install` resolves offline
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         str(src), "-w", str(tmp_path / "dist")],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    output = (proc.stdout + proc.stderr).strip()
    assert output == "", f"the build printed:\n{output}"
    (wheel,) = (tmp_path / "dist").glob("dtq-*.whl")
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".lua")}
    expected = {f"dtq_gateway/store/lua/{p.name}" for p in (ROOT / "dtq_gateway/store/lua").glob("*.lua")}
    assert shipped == expected
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"dtq_gateway/web/dashboard_static/index.html", "dtq_gateway/web/dashboard_static/app.js",
            "dtq_cli/main.py"} <= names
