"""Output of the ``dtq`` command line: JSON documents for scripts, rich tables for
people, and the conversions both need (human times and durations, decoded payloads).

JSON conventions: epoch-ms times (``*_at_ms``, ``ts_ms``) become ISO 8601 UTC
strings under the name without ``_ms`` (``created_at``), 0 becomes null; enum
values are their short names (``SUCCEEDED``, ``TASK_QUEUED``); payloads and
results are the decoded JSON value, a string for other UTF-8 bytes, else
``{"base64": "..."}``; durations keep their ``_ms`` names and integer values.
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import click
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table

from dtq_pyworker.codec import is_json


def _enum_prefix(enum_name: str) -> str:
    """The value prefix of a dtq.v1 enum: its name in upper snake case plus "_"
    (ChainState -> CHAIN_STATE_), as buf's ENUM_VALUE_PREFIX rule has every value."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", enum_name).upper() + "_"
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


# -- times and durations ---------------------------------------------------------------
def parse_duration_ms(text: str) -> int:
    """Milliseconds of a human duration: "250ms", "30s", "5m", "1h30m", "2d"; a bare
    number is seconds.

    Raises:
        ValueError: Not a duration.
    """
    text = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return round(float(text) * 1000)
    pos, total = 0, 0.0
    for match in _DURATION.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS_MS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"not a duration: {text!r} (use e.g. 500ms, 30s, 5m, 1h30m)")
    return round(total)


class Duration(click.ParamType):
    """Click type of a human duration; the value is in milliseconds, ``min_ms..max_ms``
    (the range the gateway takes for the field it fills, so that a value out of it is a
    usage error rather than a refused call, or a number its protobuf field cannot hold)."""

    name = "duration"

    def __init__(self, *, min_ms: int = 0, max_ms: int) -> None:
        self.min_ms, self.max_ms = min_ms, max_ms

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        try:
            ms = value if isinstance(value, int) else parse_duration_ms(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if not self.min_ms <= ms <= self.max_ms:
            self.fail(f"{value} is not in the range {human_duration(self.min_ms)}.."
                      f"{human_duration(self.max_ms)}", param, ctx)
        return ms


def iso(when: datetime | None) -> str | None:
    """ISO 8601 UTC with milliseconds and a Z, or None."""
    if when is None:
        return None
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def iso_ms(ms: int) -> str | None:
    """ISO 8601 UTC of epoch milliseconds (None for 0)."""
    return iso(datetime.fromtimestamp(ms / 1000.0, tz=UTC)) if ms else None


def human_duration(ms: float) -> str:
    """Compact duration: 850ms, 3.2s, 4m5s, 2h10m, 3d4h."""
    ms = abs(ms)
    if ms < 1000:
        return f"{int(ms)}ms"
    s = ms / 1000
    if s < 60:
        return f"{s:.1f}s" if s < 10 else f"{int(s)}s"
    m, s = divmod(int(s), 60)
    if m < 60:
        return f"{m}m{s}s" if s else f"{m}m"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m}m" if m else f"{h}h"
    d, h = divmod(h, 24)
    return f"{d}d{h}h" if h else f"{d}d"


def ago(ms: int, now_ms: int | None = None) -> str:
    """"3s ago" / "in 5m" for epoch milliseconds; "-" for 0."""
    if not ms:
        return "-"
    now = now_ms if now_ms is not None else int(datetime.now(UTC).timestamp() * 1000)
    delta = now - ms
    return f"{human_duration(delta)} ago" if delta >= 0 else f"in {human_duration(delta)}"


def when(ms: int) -> str:
    """ISO time plus the relative one, for detail views."""
    return f"{iso_ms(ms)} ({ago(ms)})" if ms else "-"


# -- protobuf to JSON ------------------------------------------------------------------
def jsonable_bytes(data: bytes, content_type: str | None = None) -> Any:
    """Bytes for a JSON document: the decoded JSON value when ``content_type`` is
    JSON (or unknown) and the bytes parse, None when empty, a string for other
    UTF-8, else ``{"base64": ...}``."""
    if not data:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}
    if content_type is None or is_json(content_type):
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def enum_name(field: FieldDescriptor, value: int) -> str:
    """Short name of an enum value (TASK_STATUS_QUEUED -> QUEUED)."""
    enum_type = field.enum_type
    desc = enum_type.values_by_number.get(value)
    name = desc.name if desc is not None else str(value)
    return name.removeprefix(_enum_prefix(enum_type.name))


def to_dict(msg: Message) -> dict[str, Any]:
    """A protobuf message as a JSON-ready dict (module docstring conventions)."""
    out: dict[str, Any] = {}
    content_type = getattr(msg, "content_type", None)
    truncated = getattr(msg, "result_truncated", False)
    for field in msg.DESCRIPTOR.fields:
        value = getattr(msg, field.name)
        name = field.name
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            out[name] = dict(value)
        elif field.is_repeated:
            out[name] = [to_dict(v) if isinstance(v, Message) else v for v in value]
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            out[name] = to_dict(value) if msg.HasField(name) else None
        elif field.type == FieldDescriptor.TYPE_ENUM:
            out[name] = enum_name(field, value)
        elif field.type == FieldDescriptor.TYPE_BYTES:
            if name == "result" and truncated:
                out[name] = jsonable_bytes(value, "application/octet-stream")
            else:
                out[name] = jsonable_bytes(value, content_type if name == "payload" else None)
        elif name.endswith("_at_ms") or name == "ts_ms":
            out[name.removesuffix("_ms")] = iso_ms(value)
        else:
            out[name] = value
    return out


def extra_fields(msg: Message, shown: Iterable[str]) -> list[tuple[str, Any]]:
    """Set fields of ``msg`` that a detail view does not show itself (fields a newer
    gateway added, say), as (name, text) pairs in field order."""
    skip = set(shown)
    out = []
    for name, value in to_dict(msg).items():
        if name in skip or value in (None, "", 0, False, [], {}):
            continue
        if isinstance(value, str) and (value == "UNSPECIFIED" or value.endswith("_UNSPECIFIED")):
            continue  # an enum at its zero value is unset too
        if isinstance(value, float):
            value = f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"  # rates, percents
        out.append((name.replace("_", " "), value if isinstance(value, str | int)
                    else json.dumps(value, ensure_ascii=False)))
    return out


# -- output -------------------------------------------------------------------------------
def console() -> Console:
    """A console on the current stdout; wide and without colour when not a terminal."""
    tty = sys.stdout.isatty()
    width = None if tty else max(int(os.environ.get("COLUMNS", "0") or 0), 200)
    return Console(file=sys.stdout, width=width, soft_wrap=not tty, highlight=False)


def emit_json(doc: Any) -> None:
    """Print one JSON document (sorted keys stay in field order) and a newline."""
    click.echo(json.dumps(doc, ensure_ascii=False, default=str))


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]],
          empty: str = "(none)") -> None:
    """Print a table, or ``empty`` when there are no rows."""
    rows = list(rows)
    if not rows:
        click.echo(empty)
        return
    t = Table(title=title, title_justify="left", header_style="bold")
    for col in columns:
        t.add_column(col, overflow="fold")
    for row in rows:
        t.add_row(*("-" if v is None or v == "" else str(v) for v in row))
    console().print(t)


def fields(pairs: Iterable[tuple[str, Any]]) -> None:
    """Print aligned ``name: value`` lines (a record's detail view)."""
    pairs = list(pairs)
    width = max((len(k) for k, _ in pairs), default=0)
    for key, value in pairs:
        click.echo(f"{key + ':':<{width + 1}} {'-' if value in (None, '') else value}")


def show_value(value: Any) -> str:
    """A decoded payload or result for people: compact JSON, or a bytes note."""
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return f"<{len(value)} bytes, base64 {base64.b64encode(value).decode('ascii')}>"
    return json.dumps(value, ensure_ascii=False)
