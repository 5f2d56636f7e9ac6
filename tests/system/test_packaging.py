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
    # the history charts' library, vendored with its licence (docs/dashboard.md)
    static = "dtq_gateway/web/dashboard_static/"
    assert {static + "pages.js", static + "uPlot.iife.min.js",
            static + "uPlot.min.css", static + "uPlot.LICENSE"} <= names


def _copy_project(dst: Path) -> Path:
    dst.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dst / name)
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, dst / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


@pytest.mark.slow
def test_editable_install_prints_no_setuptools_banner(tmp_path: Path) -> None:
    """`make install` (pip install -e) builds an editable wheel: with the packages at the
    root declared as such it is a plain .pth file, and setuptools prints no "!!"
    banner ("Editable installation ... folders with the same name")."""
    src = _copy_project(tmp_path / "src")
    script = ("import sys, setuptools.build_meta as b; "
              "print(b.build_editable(sys.argv[1]))")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "dist")], cwd=src,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    output = proc.stdout + proc.stderr
    assert "!!" not in output and "Editable installation" not in output, output
    (wheel,) = (tmp_path / "dist").glob("dtq-*.editable-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "__editable__.dtq-0.1.0.pth" in names
    assert not [n for n in names if n.endswith("_finder.py")]  # no import-hook finder
