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
import time

from pythonjsonlogger.json import JsonFormatter

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


class RateLimitedLog:
    """Logs a recurring problem at most once per ``every_s``, counting the rest."""

    def __init__(self, logger: logging.Logger, every_s: float = 30.0) -> None:
        self._log = logger
        self._every_s = every_s
        self._last = float("-inf")
        self._suppressed = 0

    def log(self, level: int, msg: str, *args: object, exc_info: bool = False,
            **extra: object) -> None:
        """Log ``msg`` now, or count it when one was logged less than every_s ago."""
        now = time.monotonic()
        if now - self._last < self._every_s:
            self._suppressed += 1
            return
        suffix = f" ({self._suppressed} similar suppressed)" if self._suppressed else ""
        self._log.log(level, msg + suffix, *args, exc_info=exc_info, extra=extra or None)
        self._last, self._suppressed = now, 0

    def reset(self) -> None:
        """Forget the last report (the problem is over)."""
        self._last, self._suppressed = float("-inf"), 0


#: Longest string of a log record kept whole (bytes of UTF-8, about; cut at a character).
MAX_LOG_FIELD_BYTES = 2048


def _cut(value: str, limit: int) -> str:
    if len(value) <= limit // 4:
        return value
    data = value.encode("utf-8", errors="replace")
    if len(data) <= limit:
        return value
    return data[:limit].decode("utf-8", errors="ignore") + f"...[{len(data) - limit} bytes cut]"


#: Attributes every LogRecord has: not ``extra`` values.
_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime"}


class TruncatingFilter(logging.Filter):
    """Cuts the formatted message and every string ``extra`` value of a record to
    ``max_bytes`` (default MAX_LOG_FIELD_BYTES), marking the cut. Tracebacks are kept."""

    def __init__(self, max_bytes: int = MAX_LOG_FIELD_BYTES) -> None:
        super().__init__()
        self.max_bytes = max_bytes

    def filter(self, record: logging.LogRecord) -> bool:
        """Cut the record in place; never drops it."""
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string: leave it to the handler
            return True
        cut = _cut(message, self.max_bytes)
        if cut is not message:
            record.msg, record.args = cut, None
        for name, value in list(vars(record).items()):
            if name not in _RECORD_FIELDS:
                if isinstance(value, str):
                    setattr(record, name, _cut(value, self.max_bytes))
                elif isinstance(value, (list, tuple)) and len(repr(value)) > self.max_bytes:
                    setattr(record, name, _cut(repr(value), self.max_bytes))
        return True
