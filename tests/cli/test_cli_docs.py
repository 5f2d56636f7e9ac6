"""The ``dtq`` snippets of README.md and docs/cli.md, run literally with bash against
a real gateway, so they stay true. Where ``.venv/bin/dtq`` is missing (a checkout
without ``make install``) a shim running ``python -m dtq_cli`` stands in for it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.threaded_gateway import ADMIN_TOKEN

ROOT = Path(__file__).resolve().parents[2]


def _first_sh_block(text: str) -> str:
    match = re.search(r"```sh\n(.*?)```", text, re.DOTALL)
    assert match, "no sh block"
    return match.group(1)


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:end if end != -1 else None]


SNIPPETS = {
    "README": lambda: _first_sh_block(_section((ROOT / "README.md").read_text(),
                                               "## The `dtq` command line")),
    "docs/cli.md": lambda: _first_sh_block((ROOT / "docs" / "cli.md").read_text()),
}


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_documented_dtq_commands_run(env, tmp_path, name):
    script = SNIPPETS[name]()
    assert "dtq " in script
    shim = tmp_path / "bin" / "dtq"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m dtq_cli "$@"\n')
    shim.chmod(0o755)
    run_env = {**os.environ, "PATH": f"{shim.parent}{os.pathsep}{os.environ['PATH']}",
               "DTQ_GATEWAY": env.gw.target, "DTQ_TOKEN": ADMIN_TOKEN,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                           os.environ.get("PYTHONPATH")]))}
    for name_ in ("DTQ_TLS", "DTQ_TLS_CA"):
        run_env.pop(name_, None)
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], check=False,
                          cwd=ROOT, env=run_env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"{name} snippet failed:\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
