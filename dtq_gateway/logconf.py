"""Logging setup for the gateway process (JSON lines by default; text for humans).

Only the CLI calls :func:`configure`; library code just uses
``logging.getLogger(__name__)`` and passes ids in ``extra``. Both formats show
those ``extra`` fields: JSON as keys of the object, text as ``key=value`` after
the message.
"""

from __future__ import annotations

import json
import logging
import sys

from pythonjsonlogger.json import JsonFormatter

from dtq_gateway.rpc.limits import TruncatingFilter

#: Attributes every LogRecord has; anything else on a record came from ``extra``.
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "taskName"}


class TextFormatter(logging.Formatter):
    """``<time> <LEVEL> <logger>: <message> key=value ...`` with the record's extras.

    A value holding spaces, quotes or ``=`` (or an empty one) is written as a JSON
    string, so every line splits back into its fields.
    """

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = [f"{k}={_text_value(v)}" for k, v in vars(record).items()
                  if k not in _RECORD_ATTRS and not k.startswith("_")]
        return f"{line} {' '.join(extras)}" if extras else line


def _text_value(value: object) -> str:
    text = value if isinstance(value, str) else str(value)
    if not text or any(c in text for c in ' "=\n\t'):
        return json.dumps(text)
    return text


def configure(level: str = "INFO", fmt: str = "json") -> None:
    """Send every log record to stderr as one JSON object (or text) per line."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "ts", "levelname": "level", "name": "logger"}))
    else:
        handler.setFormatter(TextFormatter())
    handler.addFilter(TruncatingFilter())  # client strings never make a line huge
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("grpc").setLevel(logging.WARNING)
