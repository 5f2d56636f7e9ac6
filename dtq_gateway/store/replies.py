"""Decoding of Redis reply values, shared by every module that reads replies."""

from __future__ import annotations

from typing import Any


def text(value: Any) -> str:
    """A Redis reply value as str ("" for None; works with and without decode_responses)."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)
