"""dtq_cli: the ``dtq`` command line, built on :class:`dtq_pyworker.admin.AdminClient`.

``cli`` is the click group with every command registered; ``dtq_cli.console.main`` is
the console script. See docs/cli.md. ``cli`` and ``ExitCode`` are imported on first use,
so that importing the package does not import grpc before the console script has set
gRPC's log level.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dtq_cli.main import ExitCode, cli

__all__ = ["ExitCode", "cli"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'dtq_cli' has no attribute {name!r}")
    from dtq_cli import main  # the group with every command added

    return getattr(main, name)
