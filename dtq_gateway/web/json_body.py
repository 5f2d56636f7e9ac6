"""The JSON body of a dashboard POST: a JSON object of at most MAX_BODY_BYTES, whose
strings are Unicode text.

Every mutating dashboard route reads its body here, so the same request gets the same
answer whichever page sent it: 413 before reading a body declared too large, 400
INVALID_ARGUMENT naming ``body`` (not JSON, nested too deeply, not an object) or the
path of a string that is no Unicode text.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from dtq_gateway.errors import InvalidArgument

#: Largest request body accepted (bytes).
MAX_BODY_BYTES = 64 * 1024


async def read_json_object(request: web.Request) -> dict[str, Any]:
    """The request's body as a JSON object ({} for an empty body).

    Raises:
        web.HTTPRequestEntityTooLarge: Content-Length over MAX_BODY_BYTES (before any
            byte of the body is read; aiohttp refuses a longer undeclared body itself).
        InvalidArgument: not JSON, nested too deeply, not an object (field ``body``), or
            a string or key with a lone surrogate escape such as ``\\ud800`` (valid JSON
            syntax, but no UTF-8 text; the field is its dotted path).
    """
    if (request.content_length or 0) > MAX_BODY_BYTES:  # refused before reading
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY_BYTES,
                                            actual_size=request.content_length or 0)
    raw = await request.read()
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        raise InvalidArgument("body: not valid JSON", field="body") from None
    except RecursionError:
        raise InvalidArgument("body: JSON nested too deeply", field="body") from None
    if not isinstance(body, dict):
        raise InvalidArgument("body: must be a JSON object", field="body")
    bad = _lone_surrogate_at(body)
    if bad is not None:
        field = ".".join(bad) or "body"
        raise InvalidArgument(f"{field}: not valid Unicode text (a lone surrogate "
                              "escape such as \\ud800)", field=field)
    return body


def _lone_surrogate_at(value: Any, path: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """The path (keys, list indexes) to the first string or key of a decoded JSON value
    that cannot be UTF-8, or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = _lone_surrogate_at(key, path) if isinstance(key, str) else None
            if found is None:
                found = _lone_surrogate_at(item, (*path, str(key)))
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _lone_surrogate_at(item, (*path, str(i)))
            if found is not None:
                return found
    return None
