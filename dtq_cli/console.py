"""The ``dtq`` console script (and ``python -m dtq_cli``): gRPC's log level, then the CLI.

gRPC's C core writes some failures to stderr itself, e.g. "ssl_transport_security.cc ...
Handshake failed" when ``--tls`` meets a plaintext gateway, before dtq's own one-line
error says the same. It reads ``GRPC_VERBOSITY`` once, when grpc is imported, so this
module imports nothing that imports grpc before setting it (and ``dtq_cli`` imports
grpc only when its commands are first used).
"""

from __future__ import annotations

import os


def main(argv: list[str] | None = None) -> None:
    """Run ``dtq``: keep only gRPC's errors (``GRPC_VERBOSITY=ERROR``) unless the user set
    ``GRPC_VERBOSITY``, then parse ``argv`` (default ``sys.argv[1:]``) and exit."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    from dtq_cli.main import main as run

    run(argv)
