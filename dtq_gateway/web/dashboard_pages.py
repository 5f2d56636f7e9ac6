"""The dashboard's history, schedules, rate limits and task links (chain, group).

:func:`add_routes` adds these endpoints to the dashboard's application; they share its
middlewares (tokens, Host and Origin guards, JSON errors naming the field):

* ``GET /api/history?queue=&minutes=`` — the stored samples (:mod:`dtq_gateway.store.
  history`) of one queue or of all queues, oldest first, for the last ``minutes``
  (1..1440, default 60).
* ``GET /api/schedules?page_size=&page_token=`` — schedules by name with next and last
  fire; ``POST /api/schedules/NAME/pause``, ``/resume``, ``/trigger``, ``/delete``
  (audited as the Admin RPCs are).
* ``GET /api/rate-limits?queue=&page_size=&page_token=`` — one page of limits;
  ``POST /api/rate-limits`` body ``{"queue", "task_type", "limit", "period_ms",
  "burst"}`` sets one, ``POST /api/rate-limits/delete`` body ``{"queue",
  "task_type"}`` removes one (both audited).
* ``GET /api/tasks/ID/links`` — the task's chain steps and its group.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from dtq_gateway.store import admin, history, ratelimits, schedules, task_links
from dtq_gateway.store.admin import CallInfo
from dtq_gateway.store.audit import append_audit
from dtq_gateway.web import dashboard_api as api
from dtq_gateway.web.json_body import read_json_object

#: Most schedules or rate limits on one page.
PAGE_MAX = 500
#: Longest history window one call returns (minutes).
MAX_HISTORY_MINUTES = 1440


def schedule_json(info: Any) -> dict[str, Any]:
    """A ``dtq.v1.ScheduleInfo`` as the dashboard shows it (times epoch ms)."""
    s = info.schedule
    return {"name": s.name, "cron": s.cron, "timezone": s.timezone,
            "interval_ms": s.interval_ms, "queue": s.task.queue, "task_type": s.task.task_type,
            "paused": s.paused, "next_fire_ms": info.next_fire_ms,
            "last_fire_ms": info.last_fire_ms, "last_task_id": info.last_task_id,
            "fires_total": info.fires_total, "created_at_ms": info.created_at_ms}


async def history_view(b: api.Backend, queue: str, minutes: int) -> dict[str, Any]:
    """The history samples of ``queue`` ("" = all queues) of the last ``minutes``."""
    if queue:
        admin.validate_queue(queue)
    interval_ms = int(b.settings.history_interval_s * 1000)
    points = await history.read(b.redis, queue, b.settings.history_points)
    now = await admin.redis_now_ms(b.redis)
    points = [p for p in points if p["t"] >= now - minutes * 60_000]
    return {"queue": queue, "interval_ms": interval_ms, "points": points}


async def audit(b: api.Backend, call: CallInfo, action: str, target: str,
                detail: str = "") -> None:
    """Append one audit entry for a dashboard action."""
    await append_audit(b.redis, call.actor, action, target, call.request_id, detail,
                       maxlen=b.settings.audit_maxlen)


async def schedule_action(b: api.Backend, name: str, action: str, call: CallInfo
                          ) -> dict[str, Any]:
    """Pause, resume, trigger or delete one schedule (audited like its RPC).

    Raises:
        NotFound: no schedule of that name (pause, resume, trigger).
        InvalidArgument: a malformed name (field ``name``).
    """
    out: dict[str, Any] = {"name": name, "request_id": call.request_id}
    if action in ("pause", "resume"):
        info = await schedules.set_paused(b.redis, name, action == "pause")
        await audit(b, call, f"{action}_schedule", name)
        out["schedule"] = schedule_json(info)
    elif action == "trigger":
        task_id = await schedules.trigger(b.redis, b.settings, b.broker, name)
        await audit(b, call, "trigger_schedule", name, task_id)
        out["task_id"] = task_id
    else:
        deleted = await schedules.delete(b.redis, name)
        await audit(b, call, "delete_schedule", name, "" if deleted else "absent")
        out["deleted"] = deleted
    return out


def _limit_json(r: ratelimits.RateLimit) -> dict[str, Any]:
    return {"queue": r.queue, "task_type": r.task_type, "limit": r.limit,
            "period_ms": r.period_ms, "burst": r.burst, "tokens": r.tokens}


async def set_rate_limit(b: api.Backend, body: dict[str, Any], call: CallInfo
                         ) -> dict[str, Any]:
    """SetRateLimit from a JSON body (audited as set_rate_limit).

    Raises:
        InvalidArgument: naming ``rate_limit.<field>`` (a wrong JSON type names it too).
    """
    def num(name: str) -> int:
        return api.int_arg(body.get(name), f"rate_limit.{name}", 0, 0, 2**31 - 1)

    rl = ratelimits.validate(api.str_arg(body.get("queue"), "rate_limit.queue", 64),
                             api.str_arg(body.get("task_type"), "rate_limit.task_type", 128),
                             num("limit"), num("period_ms"), num("burst"))
    created = await ratelimits.set_limit(b.redis, rl, call.actor,
                                         max_limits=b.settings.max_rate_limits)
    await audit(b, call, "set_rate_limit", rl.queue,
                f"task_type={rl.task_type or '*'} limit={rl.limit} period_ms={rl.period_ms} "
                f"burst={rl.burst}")
    return {"created": created, "rate_limit": _limit_json(rl), "request_id": call.request_id}


async def delete_rate_limit(b: api.Backend, body: dict[str, Any], call: CallInfo
                            ) -> dict[str, Any]:
    """DeleteRateLimit from a JSON body ``{"queue", "task_type"}`` (audited)."""
    queue = api.str_arg(body.get("queue"), "queue", 64)
    admin.validate_queue(queue)
    task_type = api.str_arg(body.get("task_type"), "task_type", 128)
    deleted = await ratelimits.delete_limit(b.redis, queue, task_type, call.actor)
    await audit(b, call, "delete_rate_limit", queue, f"task_type={task_type or '*'}")
    return {"deleted": deleted, "request_id": call.request_id}


async def task_links_view(b: api.Backend, task_id: str) -> dict[str, Any]:
    """The chain (steps, states, links) and the group (members, states, callback) of a
    task; ``chain`` / ``group`` are null when it belongs to none."""
    api.check_task_id(task_id)
    fields, _ = await b.broker.get(task_id)
    chain_id = api.text(fields.get(b"chain_id", b""))
    chain = await task_links.chain_steps(b.redis, chain_id) if chain_id else None
    group = await task_links.group_view(b.redis, task_id)
    return {"task_id": task_id, "chain": chain, "group": group}


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def add_routes(app: web.Application, dash: Any) -> None:
    """Add the endpoints of this module to the dashboard's application.

    Args:
        app: the application :meth:`Dashboard.app` builds.
        dash: the :class:`~dtq_gateway.web.dashboard.Dashboard` (backend, request
            helpers).
    """
    b: api.Backend = dash.backend

    async def get_history(request: web.Request) -> web.Response:
        q = request.query
        minutes = api.int_arg(q.get("minutes"), "minutes", 60, 1, MAX_HISTORY_MINUTES)
        return web.json_response(await history_view(b, q.get("queue", ""), minutes))

    async def get_schedules(request: web.Request) -> web.Response:
        q = request.query
        size = api.int_arg(q.get("page_size"), "page_size", 100, 1, PAGE_MAX)
        infos, token = await schedules.list_page(b.redis, size, q.get("page_token", ""))
        return web.json_response({"schedules": [schedule_json(i) for i in infos],
                                  "next_page_token": token})

    def schedule_post(action: str) -> Handler:
        async def handle(request: web.Request) -> web.Response:
            await read_json_object(request)
            return web.json_response(await schedule_action(
                b, request.match_info["name"], action, dash._call(request)))
        return handle

    async def get_limits(request: web.Request) -> web.Response:
        q = request.query
        size = api.int_arg(q.get("page_size"), "page_size", 100, 1, PAGE_MAX)
        limits, token = await ratelimits.list_page(b.redis, size, q.get("page_token", ""),
                                                   q.get("queue", ""))
        return web.json_response({"rate_limits": [_limit_json(r) for r in limits],
                                  "next_page_token": token})

    async def post_limit(request: web.Request) -> web.Response:
        return web.json_response(await set_rate_limit(b, await dash._body(request),
                                                      dash._call(request)))

    async def post_limit_delete(request: web.Request) -> web.Response:
        return web.json_response(await delete_rate_limit(b, await dash._body(request),
                                                         dash._call(request)))

    async def get_links(request: web.Request) -> web.Response:
        return web.json_response(await task_links_view(b, request.match_info["task_id"]))

    r = app.router
    r.add_get("/api/history", get_history)
    r.add_get("/api/schedules", get_schedules)
    for action in ("pause", "resume", "trigger", "delete"):
        r.add_post("/api/schedules/{name}/" + action, schedule_post(action))
    r.add_get("/api/rate-limits", get_limits)
    r.add_post("/api/rate-limits", post_limit)
    r.add_post("/api/rate-limits/delete", post_limit_delete)
    r.add_get("/api/tasks/{task_id}/links", get_links)
