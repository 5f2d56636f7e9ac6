"""dtq_cli: the ``dtq`` command line, built on :class:`dtq_pyworker.admin.AdminClient`.

``cli`` is the click group with every command registered; ``main`` is the console
script. See docs/cli.md.
"""

from dtq_cli import admin_cmd, tasks_cmd  # noqa: F401 - registers the commands
from dtq_cli.main import ExitCode, cli, main

__all__ = ["ExitCode", "cli", "main"]
