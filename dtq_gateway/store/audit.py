"""Audit trail: request ids and entries of ``dtq:stream:audit``.

Every destructive Admin call and every CancelTask appends
``{actor, action, task_id, ts, request_id, detail}`` to the audit stream
(approximate MAXLEN ``DTQ_AUDIT_MAXLEN``) and logs one structured line. ``ts`` is
epoch ms from Redis TIME. When the entry must be atomic with a state change, the
state-changing Lua script appends it itself (``lua/_audit.lua``, see
:mod:`dtq_gateway.store.admin_scripts`) and the caller only calls :func:`log_audit`.
"""

from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass
from typing import Any

from dtq_gateway.store import keys
from dtq_gateway.store.admin_scripts import AUDIT_APPEND
from dtq_gateway.store.client import Client

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "x-request-id"
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:/-]{1,128}\Z")


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One appended audit entry."""

    entry_id: str
    ts_ms: int

    @classmethod
    def of(cls, reply: list[Any]) -> AuditRecord:
        """Decode audit_append.lua's ``{entry id, ts (epoch ms)}``."""
        entry_id = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        return cls(entry_id=entry_id, ts_ms=int(reply[1]))


def request_id_of(context: Any) -> str:
    """Request id of the call: the ``x-request-id`` metadata or a fresh uuid hex.

    A supplied id must be 1..128 characters of ``[A-Za-z0-9._:/-]``; anything else
    is replaced by a generated one. The id is also returned to the caller in the
    ``x-request-id`` trailing metadata. Call it once per call.
    """
    supplied = ""
    for key, value in context.invocation_metadata() or ():
        if key == REQUEST_ID_HEADER:
            supplied = value.decode() if isinstance(value, bytes) else str(value)
            break
    request_id = supplied if _REQUEST_ID_RE.match(supplied) else uuid.uuid4().hex
    try:
        context.set_trailing_metadata(((REQUEST_ID_HEADER, request_id),))
    except Exception:
        log.debug("could not set x-request-id trailer", exc_info=True)
    return request_id


def log_audit(actor: str, action: str, task_id: str, request_id: str, detail: str = "",
              ts_ms: int = 0) -> None:
    """Emit the structured log line that accompanies an audit entry."""
    log.info("audit %s", action, extra={
        "audit_actor": actor, "audit_action": action, "task_id": task_id,
        "request_id": request_id, "detail": detail, "ts_ms": ts_ms})


async def append_audit(redis: Client, actor: str, action: str, task_id: str, request_id: str,
                       detail: str = "", *, maxlen: int = 10000) -> AuditRecord:
    """XADD one audit entry (MAXLEN ~ ``maxlen``) and log it.

    Args:
        redis: the gateway's client.
        actor: authenticated identity, see :func:`dtq_gateway.rpc.auth.actor_of`.
        action: e.g. ``cancel_task``.
        task_id: task id, queue name, or "".
        request_id: from :func:`request_id_of`.
        detail: free text (e.g. a reason).
        maxlen: approximate bound of the stream (entries), ``Settings.audit_maxlen``.

    Returns:
        The entry id and its timestamp (epoch ms, Redis TIME).
    """
    record = AuditRecord.of(await AUDIT_APPEND(redis, [keys.AUDIT], AUDIT_APPEND.argv(
        maxlen, actor, action, task_id, request_id, detail)))
    log_audit(actor, action, task_id, request_id, detail, record.ts_ms)
    return record
