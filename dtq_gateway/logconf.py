"""Logging setup for the gateway process (JSON lines by default; text for humans).

Only the CLI calls :func:`configure`; library code just uses
``logging.getLogger(__name__)`` and passes ids in ``extra``.
"""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter

from dtq_gateway.limits import TruncatingFilter


def configure(level: str = "INFO", fmt: str = "json") -> None:
    """Send every log record to stderr as one JSON object (or text) per line."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "ts", "levelname": "level", "name": "logger"}))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(TruncatingFilter())  # client strings never make a line huge
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("grpc").setLevel(logging.WARNING)
