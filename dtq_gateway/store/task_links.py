"""Reads for the dashboard's task page: the steps of a task's chain and its group.

Both are bounded: a chain is walked from its first task along ``next_task_id`` for at
most :data:`MAX_CHAIN_STEPS` records (one HMGET each, the next id is only known from
the previous record), and a group shows at most :data:`MAX_GROUP_MEMBERS` members'
states (one HGETALL of the group record and one pipelined HMGET per member).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, cast

from dtq_gateway.store import keys
from dtq_gateway.store.admin_common import as_int
from dtq_gateway.store.client import Client
from dtq_gateway.store.replies import text
from dtq_proto import dtq_pb2 as pb

#: Most chain steps read from Redis for one task page.
MAX_CHAIN_STEPS = 50
#: Most group members whose task state is read for one task page.
MAX_GROUP_MEMBERS = 200


def _template_type(item: Any) -> str:
    """The task type of one ``chain_next`` template (base64 EnqueueRequest)."""
    try:
        return pb.EnqueueRequest.FromString(base64.b64decode(str(item))).task_type
    except (binascii.Error, ValueError, TypeError):
        return ""


async def chain_steps(redis: Client, first_id: str) -> dict[str, Any]:
    """The steps of the chain that starts with ``first_id``, in order.

    Returns:
        ``{"steps": [...], "more": bool}``: each step is ``{"step", "task_id", "queue",
        "task_type", "status"}``; the steps not created yet (the last created step has
        not succeeded) have ``task_id`` "" and ``status`` "NOT_CREATED". ``more`` is True
        when the chain is longer than MAX_CHAIN_STEPS.
    """
    steps: list[dict[str, Any]] = []
    task_id, later = first_id, cast(list[str], [])
    while task_id and len(steps) < MAX_CHAIN_STEPS:
        f = await redis.hmget(keys.task(task_id), "queue", "task_type", "status",
                              "chain_step", "next_task_id", "chain_next")
        if not any(f):
            steps.append({"step": len(steps), "task_id": task_id, "queue": "",
                          "task_type": "", "status": "GONE"})
            break
        steps.append({"step": as_int(f[3]), "task_id": task_id, "queue": text(f[0]),
                      "task_type": text(f[1]), "status": text(f[2]).upper()})
        task_id = text(f[4])
        try:
            later = json.loads(f[5]) if f[5] else []
        except ValueError:
            later = []
    if not task_id and isinstance(later, list):
        last = steps[-1]["step"] if steps else 0
        for i, item in enumerate(later[:max(0, MAX_CHAIN_STEPS - len(steps))]):
            steps.append({"step": last + 1 + i, "task_id": "", "queue": "",
                          "task_type": _template_type(item), "status": "NOT_CREATED"})
    return {"steps": steps, "more": bool(task_id)}


async def group_view(redis: Client, task_id: str) -> dict[str, Any] | None:
    """The group ``task_id`` belongs to (None when it is in none, or the record is gone).

    Returns:
        ``{"group_id", "queue" (the callback's queue), "state" (open, done, abandoned),
        "total", "done", "callback": {"queue", "task_type", "task_id"}, "members":
        [{"task_id", "status", "task_type"}], "more": bool}``; a member's status is its
        task's (upper case), or the recorded outcome once its record is gone.
    """
    gid, gq = (text(x) for x in await redis.hmget(keys.task(task_id), "group_id",
                                                    "group_queue"))
    if not gid or not keys.QUEUE_RE.match(gq):
        return None
    h = await redis.hgetall(keys.group(gq, gid))
    if not h:
        return {"group_id": gid, "queue": gq, "state": "GONE", "total": 0, "done": 0,
                "callback": None, "members": [], "more": False}
    try:
        members = [str(m) for m in json.loads(h.get(b"members") or b"[]")]
    except ValueError:
        members = []
    shown = members[:MAX_GROUP_MEMBERS]
    async with redis.pipeline(transaction=False) as pipe:
        for m in shown:
            pipe.hmget(keys.task(m), "status", "task_type")
        rows = await pipe.execute(raise_on_error=False) if shown else []
    out = []
    for m, row in zip(shown, rows):
        status, ttype = ("", "") if isinstance(row, Exception) else (text(x) for x in row)
        if not status:
            try:
                status = str(json.loads(h.get(f"m:{m}".encode()) or b"{}").get("status", ""))
            except (ValueError, AttributeError):
                status = ""
        out.append({"task_id": m, "status": (status or "GONE").upper(), "task_type": ttype})
    try:
        cb = pb.EnqueueRequest.FromString(h.get(b"callback", b""))
        callback = {"queue": cb.queue, "task_type": cb.task_type,
                    "task_id": text(h.get(b"callback_task_id", b""))}
    except ValueError:
        callback = None
    return {"group_id": gid, "queue": gq, "state": text(h.get(b"state", b"")).upper(),
            "total": as_int(h.get(b"total")), "done": as_int(h.get(b"done")),
            "callback": callback, "members": out, "more": len(members) > len(shown)}
