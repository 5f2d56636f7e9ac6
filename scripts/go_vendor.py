"""Build the Go client's vendor directory from Debian's Go packages, offline.

Usage: python scripts/go_vendor.py [--gocode DIR]

The Go client (clients/go, module ``dtq/clients/go``) builds with
``GOFLAGS=-mod=vendor``: no module proxy is needed. This script copies every
non-standard package the client imports, and what those import in turn, from the
GOPATH-layout tree of Debian's ``golang-google-grpc-dev`` and
``golang-goprotobuf-dev`` packages (``/usr/share/gocode``) into
``clients/go/vendor/`` and writes ``vendor/modules.txt`` with the versions that
``clients/go/go.mod`` requires. The vendor directory is not checked in (it is
rebuilt by ``make install``).

Exit status: 0 when written, 2 when go or the Debian packages are missing.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULE_DIR = ROOT / "clients" / "go"
MODULE = "dtq/clients/go"
GO_LANG = "1.17"
#: the imports of each package and of its tests
IMPORTS_FMT = '{{join .Imports "\\n"}}\n{{join .TestImports "\\n"}}'
REQUIRE = re.compile(r"^\s*(?:require\s+)?([a-z0-9.\-]+\.[a-z]+/[^\s]+)\s+(v[^\s]+)", re.MULTILINE)


def go_env(gocode: Path) -> dict[str, str]:
    """Environment for GOPATH-mode ``go list`` over the Debian tree."""
    return {**os.environ, "GO111MODULE": "off", "GOPATH": str(gocode), "GOFLAGS": ""}


def own_imports() -> list[str]:
    """Non-standard import paths of the client's own packages (outside the module)."""
    out = subprocess.run(
        ["go", "list", "-e", "-f", IMPORTS_FMT, "./..."],
        cwd=MODULE_DIR, env={**os.environ, "GO111MODULE": "off", "GOFLAGS": ""},
        capture_output=True, text=True, check=True).stdout
    paths = {p.strip() for p in out.splitlines()}
    return sorted(p for p in paths if "." in p.split("/")[0] and not p.startswith(MODULE))


def dependencies(imports: list[str], gocode: Path) -> dict[str, Path]:
    """Every non-standard package the imports need: import path -> source directory."""
    fmt = "{{if not .Standard}}{{.ImportPath}} {{.Dir}}{{end}}"
    out = subprocess.run(["go", "list", "-deps", "-f", fmt, *imports], cwd=gocode,
                         env=go_env(gocode), capture_output=True, text=True, check=True).stdout
    pkgs = {}
    for line in out.splitlines():
        if line.strip():
            path, directory = line.split(" ", 1)
            pkgs[path] = Path(directory)
    return pkgs


def required_modules() -> dict[str, str]:
    """Module path -> version, from the require block of clients/go/go.mod."""
    text = (MODULE_DIR / "go.mod").read_text()
    return dict(REQUIRE.findall(text))


def module_of(package: str, modules: dict[str, str]) -> str:
    """The longest required module path that contains ``package``."""
    owners = [m for m in modules if package == m or package.startswith(m + "/")]
    if not owners:
        raise SystemExit(f"go.mod requires no module for {package}")
    return max(owners, key=len)


def write_vendor(pkgs: dict[str, Path], modules: dict[str, str]) -> Path:
    """Copy each package's files (not its tests or subdirectories); write modules.txt."""
    vendor = MODULE_DIR / "vendor"
    shutil.rmtree(vendor, ignore_errors=True)
    by_module: dict[str, list[str]] = {m: [] for m in modules}
    for path, src in sorted(pkgs.items()):
        dest = vendor / path
        dest.mkdir(parents=True)
        for f in src.iterdir():
            if f.is_file() and not f.name.endswith("_test.go"):
                shutil.copyfile(f, dest / f.name)
        by_module[module_of(path, modules)].append(path)
    lines = []
    for mod, version in sorted(modules.items()):
        # the go version sets the language version of the vendored code (x/sys
        # needs 1.17; without it the go command assumes 1.16)
        lines += [f"# {mod} {version}", f"## explicit; go {GO_LANG}", *by_module[mod]]
    (vendor / "modules.txt").write_text("\n".join(lines) + "\n")
    return vendor


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gocode", default="/usr/share/gocode", type=Path,
                        help="GOPATH-layout tree of Debian's Go packages")
    args = parser.parse_args()
    if shutil.which("go") is None or not (args.gocode / "src" / "google.golang.org" /
                                          "grpc").is_dir():
        print(f"go or {args.gocode}/src/google.golang.org/grpc missing: "
              "apt-get install golang-go golang-google-grpc-dev golang-goprotobuf-dev")
        return 2
    pkgs = dependencies(own_imports(), args.gocode)
    vendor = write_vendor(pkgs, required_modules())
    print(f"vendored {len(pkgs)} packages into {vendor.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
