"""Regenerate the checked-in Python stubs in dtq_proto/ from proto/dtq.proto and KEDA's
external scaler contract proto/keda/externalscaler.proto (into dtq_proto/keda/).

Usage: python scripts/gen_proto.py [--check]

The proto is mapped to the virtual path ``dtq_proto/dtq.proto`` so the generated
modules import each other as ``dtq_proto.dtq_pb2`` (a package import, not a
top-level one). ``--check`` regenerates into a temporary directory and exits 1
when the checked-in files differ, which CI uses to catch a stale checkout.
grpcio-tools is pinned in pyproject.toml to the grpcio runtime floor.
"""

from __future__ import annotations

import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "dtq_proto"
GENERATED = ("dtq_pb2.py", "dtq_pb2.pyi", "dtq_pb2_grpc.py", "keda/externalscaler_pb2.py",
             "keda/externalscaler_pb2.pyi", "keda/externalscaler_pb2_grpc.py")


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


def main() -> int:
    check = "--check" in sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        fresh = Path(tmp) / "dtq_proto"
        if check:
            stale = [n for n in GENERATED if not (OUT / n).exists()
                     or not filecmp.cmp(fresh / n, OUT / n, shallow=False)]
            # the packaged copy of the proto (comments included: they are the docs
            # reflection and packaged users read) must equal the source
            if not filecmp.cmp(ROOT / "proto" / "dtq.proto", OUT / "dtq.proto", shallow=False):
                stale.append("dtq.proto")
            if stale:
                print(f"generated stubs are stale: {', '.join(stale)}; run make proto")
                return 1
            print("generated stubs are up to date")
            return 0
        for name in GENERATED:
            shutil.copyfile(fresh / name, OUT / name)
        shutil.copyfile(ROOT / "proto" / "dtq.proto", OUT / "dtq.proto")
    print(f"wrote {', '.join(GENERATED)} to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
