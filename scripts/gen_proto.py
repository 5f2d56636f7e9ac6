"""Regenerate the checked-in Python stubs in dtq_proto/ from proto/dtq.proto and KEDA's
external scaler contract proto/keda/externalscaler.proto (into dtq_proto/keda/).

Also regenerate the Go client's stubs in clients/go/dtqpb/ when protoc-gen-go and
protoc-gen-go-grpc are on PATH (Debian: protoc-gen-go 1.3.5 of golang-goprotobuf-dev
and protoc-gen-go-grpc 1.0, which build with Debian's grpc-go 1.33; see
clients/go/README.md). That protoc-gen-go predates proto3 ``optional``, so the Go
stubs are made from a copy of the proto in which each ``optional T f = N;`` is
written as the synthetic oneof it stands for, ``oneof _f { T f = N; }`` (the same
wire format and the same field presence), and which names its ``go_package``. Without the plugins the Go part is skipped
with one line.

Usage: python scripts/gen_proto.py [--check]

The proto is mapped to the virtual path ``dtq_proto/dtq.proto`` so the generated
modules import each other as ``dtq_proto.dtq_pb2`` (a package import, not a
top-level one). ``--check`` regenerates into a temporary directory and exits 1
when the checked-in files differ, which CI uses to catch a stale checkout.
grpcio-tools is pinned in pyproject.toml to the grpcio runtime floor.
"""

from __future__ import annotations

import filecmp
import re
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "dtq_proto"
GENERATED = ("dtq_pb2.py", "dtq_pb2.pyi", "dtq_pb2_grpc.py", "keda/externalscaler_pb2.py",
             "keda/externalscaler_pb2.pyi", "keda/externalscaler_pb2_grpc.py")
GO_OUT = ROOT / "clients" / "go" / "dtqpb"
GO_GENERATED = ("dtq.pb.go", "dtq_grpc.pb.go")
GO_PACKAGE = "dtq/clients/go/dtqpb;dtqpb"  # import path;package name
GO_PLUGINS = ("protoc-gen-go", "protoc-gen-go-grpc")
OPTIONAL = re.compile(r"^(\s*)optional (\S+) (\w+) = (\d+);", re.MULTILINE)


def generate(out_dir: Path) -> None:
    """Run protoc (from grpcio-tools) into out_dir/dtq_proto/."""
    include = str(Path(protoc.__file__).parent / "_proto")
    args = [
        "protoc",
        f"-Idtq_proto={ROOT / 'proto'}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        "dtq_proto/dtq.proto",
        "dtq_proto/keda/externalscaler.proto",
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def generate_go(out_dir: Path) -> bool:
    """Run protoc with the Go plugins into out_dir; False when a plugin is missing."""
    missing = [p for p in GO_PLUGINS if shutil.which(p) is None]
    if missing:
        print(f"Go stubs skipped: {', '.join(missing)} not on PATH "
              "(apt-get install golang-goprotobuf-dev protoc-gen-go-grpc)")
        return False
    src = out_dir / "go-src"
    src.mkdir()
    text = (ROOT / "proto" / "dtq.proto").read_text()
    text = OPTIONAL.sub(r"\1oneof _\3 { \2 \3 = \4; }", text)
    # protoc-gen-go 1.3.5 takes the Go package name from go_package only (not from M)
    text = text.replace("package dtq.v1;", f'package dtq.v1;\noption go_package = "{GO_PACKAGE}";', 1)
    (src / "dtq.proto").write_text(text)
    opt = "paths=source_relative"
    args = ["protoc", f"-I{src}", f"--go_out={opt}:{out_dir}",
            f"--go-grpc_out={opt}:{out_dir}", str(src / "dtq.proto")]
    if protoc.main(args) != 0:
        raise SystemExit("protoc (Go) failed")
    return True


def stale_go(fresh: Path) -> list[str]:
    """Checked-in Go stubs that differ from the fresh ones in ``fresh``."""
    return [f"clients/go/dtqpb/{n}" for n in GO_GENERATED if not (GO_OUT / n).exists()
            or not filecmp.cmp(fresh / n, GO_OUT / n, shallow=False)]


def main() -> int:
    check = "--check" in sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        fresh = Path(tmp) / "dtq_proto"
        go_dir = Path(tmp) / "go"
        go_dir.mkdir()
        with_go = generate_go(go_dir)
        if check:
            stale = [n for n in GENERATED if not (OUT / n).exists()
                     or not filecmp.cmp(fresh / n, OUT / n, shallow=False)]
            # the packaged copy of the proto (comments included: they are the docs
            # reflection and packaged users read) must equal the source
            if not filecmp.cmp(ROOT / "proto" / "dtq.proto", OUT / "dtq.proto", shallow=False):
                stale.append("dtq.proto")
            if with_go:
                stale += stale_go(go_dir)
            if stale:
                print(f"generated stubs are stale: {', '.join(stale)}; run make proto")
                return 1
            print("generated stubs are up to date" + (" (Python and Go)" if with_go else ""))
            return 0
        for name in GENERATED:
            shutil.copyfile(fresh / name, OUT / name)
        shutil.copyfile(ROOT / "proto" / "dtq.proto", OUT / "dtq.proto")
        if with_go:
            for name in GO_GENERATED:
                shutil.copyfile(go_dir / name, GO_OUT / name)
            print(f"wrote {', '.join(GO_GENERATED)} to {GO_OUT}")
    print(f"wrote {', '.join(GENERATED)} to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
