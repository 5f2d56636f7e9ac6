"""Helpers every admin module of the store shares: the caller of an audited call,
Redis TIME in ms, reply integers, queue names and page tokens.

A leaf below :mod:`~dtq_gateway.store.admin`, :mod:`~dtq_gateway.store.admin_dlq`,
:mod:`~dtq_gateway.store.admin_lists` and :mod:`~dtq_gateway.store.admin_waiting`: it
imports none of them, so they import it (and each other) without a cycle.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dtq_gateway.errors import InvalidArgument
from dtq_gateway.store import keys
from dtq_gateway.store.client import Client
from dtq_gateway.store.replies import text

ENTRY_ID_RE = re.compile(r"^[0-9]{1,20}-[0-9]{1,20}\Z")


@dataclass(frozen=True, slots=True)
class CallInfo:
    """Who asked (audit actor) and the request id of the call."""

    actor: str
    request_id: str


#: Largest value of a uint64 field (as_int clamps to it).
UINT64_MAX = (1 << 64) - 1


def as_int(value: Any) -> int:
    """Redis reply value as int (0 when empty or malformed), clamped to 0..2^64-1
    where larger (a stored counter can never break the reply's uint64 fields).
    Integers are parsed exactly (a float round trip turns 2^64-1 into 2^64)."""
    raw = text(value) or "0"
    try:
        number = int(raw)
    except ValueError:
        try:
            number = int(float(raw))
        except (ValueError, OverflowError):
            return 0
    return min(number, UINT64_MAX)


def entry_ms(entry_id: str) -> int:
    """Epoch ms part of a stream entry id (Redis TIME at XADD)."""
    return int(entry_id.split("-", 1)[0])


def validate_queue(name: str, field_name: str = "queue") -> str:
    """Check a queue name against ``keys.QUEUE_RE``.

    Raises:
        InvalidArgument: names ``field_name``.
    """
    if not keys.QUEUE_RE.match(name or ""):
        raise InvalidArgument(f"{field_name}: queue name must match [A-Za-z0-9_.-]{{1,64}}",
                              field=field_name)
    return name


def validate_page_token(token: str, field_name: str = "page_token") -> str:
    """A page token is a stream entry id ("" = first page): ``<ms>-<seq>``, both at most
    2^64-1, and not ``0-0`` (nothing lies before it).

    Raises:
        InvalidArgument: names ``field_name``.
    """
    if token:
        ms, _, seq = token.partition("-")
        if not ENTRY_ID_RE.match(token) or int(ms) > UINT64_MAX or int(seq) > UINT64_MAX \
                or token == "0-0" or (int(ms) == 0 and int(seq) == 0):
            raise InvalidArgument(f"{field_name}: malformed page token (a stream entry id "
                                  "from next_page_token)", field=field_name)
    return token


def page_size(value: int, field_name: str, default: int, maximum: int) -> int:
    """Apply the "0 = default, 1..maximum" rule of the listing requests."""
    if value == 0:
        return default
    if value > maximum:
        raise InvalidArgument(f"{field_name}: at most {maximum}", field=field_name)
    return value


async def redis_now_ms(redis: Client) -> int:
    """Now in epoch ms from Redis TIME."""
    sec, usec = await redis.time()
    return int(sec) * 1000 + int(usec) // 1000


def validate_queue_page_token(token: str, field_name: str = "page_token") -> str:
    """A ListQueues page token is the last queue name of the previous page ("" = first)."""
    if token and not keys.QUEUE_RE.match(token):
        raise InvalidArgument(f"{field_name}: malformed page token", field=field_name)
    return token
