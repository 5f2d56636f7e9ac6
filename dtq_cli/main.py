"""The ``dtq`` command line assembled: the group of :mod:`dtq_cli.group` with the
commands of every ``*_cmd`` module added to it.

This module sits on top: it imports the group and the command modules, which import
the group but never this module, so the imports have no cycle. Importing it registers
every command once.
"""

from __future__ import annotations

import sys

from dtq_cli import admin_cmd, bulk_cmd, schedule_cmd, tasks_cmd
from dtq_cli.group import ExitCode, cli

__all__ = ["ExitCode", "cli", "main"]

for _module in (tasks_cmd, bulk_cmd, admin_cmd, schedule_cmd):
    for _command in _module.COMMANDS:
        cli.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    """Run ``dtq`` with ``argv`` (default ``sys.argv[1:]``) and exit; the console script
    is :func:`dtq_cli.console.main`, which sets gRPC's log level first."""
    cli.main(args=argv if argv is not None else sys.argv[1:], prog_name="dtq")
