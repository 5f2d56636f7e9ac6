"""The web dashboard: a static page and a JSON API served by the gateway (aiohttp).

Off unless ``DTQ_DASHBOARD_PORT`` is set; it listens on ``DTQ_DASHBOARD_HOST``
(127.0.0.1 by default). The page (``dashboard_static/``: HTML, CSS and plain
JavaScript, shipped in the package, nothing fetched at run time) draws everything
from the API below; the API calls the gateway's internals directly
(:mod:`dtq_gateway.web.dashboard_api`), not the gRPC services.

Security model (docs/dashboard.md):

* **Tokens.** With ``DTQ_AUTH_TOKENS`` set, every ``/api/`` call except
  ``/api/info`` needs ``Authorization: Bearer <token>`` of the **admin** role, reads
  included (payloads may be sensitive; the gRPC Admin service asks the same). The
  page keeps the token in ``sessionStorage`` and sends it as that header; no cookie
  is ever used, so a foreign site cannot ride on a logged-in browser.
* **Actions** are POST with a JSON body: ``Content-Type: application/json`` is
  required (a cross-site form cannot send it without a CORS preflight, which is never
  granted) and a present ``Origin`` must be this server's own.
* **DNS rebinding.** Without tokens, the ``Host`` header must be an IP address,
  ``localhost``, this machine's host name or ``DTQ_DASHBOARD_HOST``.
* **Escaping.** The page inserts every value as text (never as HTML), and a strict
  Content-Security-Policy forbids inline and foreign scripts.

Errors map like the RPCs: INVALID_ARGUMENT → 400, UNAUTHENTICATED → 401,
PERMISSION_DENIED → 403, NOT_FOUND → 404, FAILED_PRECONDITION → 409,
RESOURCE_EXHAUSTED → 429, UNAVAILABLE → 503, anything else → 500; the body is
``{"error": {"code", "reason", "message", "field"}}`` and never a traceback.
"""

from __future__ import annotations

import asyncio
import contextvars
import hmac
import ipaddress
import logging
import re
import socket
import uuid
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

import grpc
from aiohttp import web

from dtq_gateway.errors import DtqError, InvalidArgument, PermissionDenied, Unauthenticated
from dtq_gateway.events.events_hub import EventsHub
from dtq_gateway.listen import ListenError, reason_of
from dtq_gateway.rpc.auth import Principal, parse_tokens
from dtq_gateway.rpc.grpc_errors import to_dtq_error
from dtq_gateway.store import keys
from dtq_gateway.store.admin_common import (
    CallInfo,
    validate_page_token,
    validate_queue_page_token,
)
from dtq_gateway.web import dashboard_api as api
from dtq_gateway.web import dashboard_pages
from dtq_gateway.web.dashboard_events import event_stream
from dtq_gateway.web.http_log import SERVER_LOG
from dtq_gateway.web.json_body import MAX_BODY_BYTES, read_json_object

log = logging.getLogger(__name__)

#: gRPC code → HTTP status of the JSON API.
HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.FAILED_PRECONDITION: 409, grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
}
_HTTP_CODES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
               404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 413: "TOO_LARGE"}
STATIC = {"/": ("index.html", "text/html"), "/static/app.js": ("app.js", "text/javascript"),
          "/static/bulk.js": ("bulk.js", "text/javascript"),
          "/static/app.css": ("app.css", "text/css"),
          # history charts, schedules, rate limits, chain and group (dashboard_pages.py)
          "/static/pages.js": ("pages.js", "text/javascript"),
          # uPlot 1.6.31 (MIT, uPlot.LICENSE), from npm, unmodified
          "/static/uPlot.iife.min.js": ("uPlot.iife.min.js", "text/javascript"),
          "/static/uPlot.min.css": ("uPlot.min.css", "text/css")}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:/-]{1,128}\Z")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: The authenticated caller of the request being handled (None without tokens).
_principal: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "dtq_dashboard_principal", default=None)


def error_body(err: DtqError) -> dict[str, Any]:
    """The JSON error of a domain error."""
    return {"error": {"code": err.code.name, "reason": err.reason, "message": err.message,
                      "field": err.field}}


def error_response(exc: BaseException) -> web.Response:
    """Map any exception to a JSON error response (unknown ones are logged, 500)."""
    err = to_dtq_error(exc)
    status = HTTP_STATUS.get(err.code, 500)
    headers = {"Retry-After": str(max(1, err.retry_after_ms // 1000))} if status in (
        429, 503) else None
    return web.json_response(error_body(err), status=status, headers=headers)


def _http_error(exc: web.HTTPException) -> web.Response:
    code = _HTTP_CODES.get(exc.status, "HTTP_ERROR")
    message = {404: "no such API path", 405: "method not allowed",
               413: f"request body over {MAX_BODY_BYTES} bytes"}.get(exc.status, exc.reason)
    return web.json_response({"error": {"code": code, "reason": code, "message": message,
                                        "field": "body" if exc.status == 413 else ""}},
                             status=exc.status)


def host_allowed(host_header: str, configured: str) -> bool:
    """True when the Host header names an IP address, localhost, this machine or the
    configured dashboard host (a DNS-rebinding page names its own domain)."""
    host = host_header.strip().lower()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    if not host:
        return False
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    names = {"localhost", socket.gethostname().lower(), configured.strip().lower()}
    return host in names or host.endswith(".localhost")


class Dashboard:
    """The dashboard's HTTP server. ``await start()``, then ``await stop()``.

    Args:
        backend: what the API reads and acts through.
        hub: the gateway's events hub (live feed, throughput).
        host: listen address (``DTQ_DASHBOARD_HOST``).
        port: listen port (``DTQ_DASHBOARD_PORT``; 0 picks a free one, for tests).
    """

    def __init__(self, backend: api.Backend, hub: EventsHub, host: str, port: int) -> None:
        self.backend = backend
        self.hub = hub
        self.host = host
        self.requested_port = port
        tokens = backend.settings.auth_tokens
        self.tokens: dict[str, Principal] = parse_tokens(tokens) if tokens else {}
        self._static = {path: (resources.files("dtq_gateway.web").joinpath(
            "dashboard_static", name).read_bytes(), ctype)
            for path, (name, ctype) in STATIC.items()}
        self._runner: web.AppRunner | None = None
        self._stopping = asyncio.Event()
        self.port = 0

    # -- server ----------------------------------------------------------------------
    def app(self) -> web.Application:
        """The aiohttp application (routes and middlewares)."""
        app = web.Application(middlewares=[self._errors, self._guard],
                              client_max_size=MAX_BODY_BYTES)
        app.on_response_prepare.append(_security_headers)
        r = app.router
        for path in STATIC:
            r.add_get(path, self._serve_static)
        r.add_get("/api/info", self._info)
        r.add_get("/api/queues", self._queues)
        r.add_get("/api/queues/{name}", self._queue)
        r.add_post("/api/queues/{name}/pause", self._pause)
        r.add_post("/api/queues/{name}/resume", self._resume)
        r.add_post("/api/queues/{name}/purge", self._purge)
        r.add_post("/api/tasks/cancel-matching", self._cancel_matching)
        r.add_post("/api/search", self._search)
        r.add_get("/api/tasks/{task_id}", self._task)
        r.add_post("/api/tasks/{task_id}/cancel", self._cancel)
        r.add_get("/api/recent", self._recent)
        r.add_get("/api/dead-letters", self._dead_letters)
        r.add_post("/api/dead-letters/redrive", self._redrive)
        r.add_post("/api/dead-letters/{task_id}/requeue", self._requeue)
        r.add_post("/api/dead-letters/{task_id}/discard", self._discard)
        r.add_get("/api/workers", self._workers)
        r.add_get("/api/audit", self._audit)
        r.add_get("/api/events", self._events)
        dashboard_pages.add_routes(app, self)
        return app

    async def start(self) -> None:
        """Bind and serve.

        Raises:
            ListenError: the address cannot be bound (``dashboard cannot listen on
                HOST:PORT: <reason>``); nothing is left running.
        """
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False,
                                    shutdown_timeout=2.0, logger=SERVER_LOG)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.requested_port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            host = f"[{self.host}]" if ":" in self.host else self.host
            raise ListenError("dashboard", f"{host}:{self.requested_port}",
                              reason_of(exc)) from None
        self.port = int(self._runner.addresses[0][1])
        if not self.tokens and not _is_loopback(self.host):
            log.warning("dashboard listens on a non-loopback address without "
                        "DTQ_AUTH_TOKENS: anyone who reaches it can requeue, discard and "
                        "pause", extra={"host": self.host, "port": self.port})
        host = f"[{self.host}]" if ":" in self.host else self.host
        log.info("dashboard listening on http://%s:%d/", host, self.port,
                 extra={"host": self.host, "port": self.port, "auth": bool(self.tokens)})

    async def stop(self) -> None:
        """End live feeds and close the server."""
        self._stopping.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- middlewares -----------------------------------------------------------------
    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if request.path.startswith("/api/") or exc.status >= 400:
                return _http_error(exc)
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped like the RPCs
            return error_response(exc)

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self.tokens and not host_allowed(request.host, self.host):
            raise PermissionDenied("Host header not allowed (DNS rebinding guard): use an "
                                   "IP address, localhost or DTQ_DASHBOARD_HOST",
                                   reason="HOST_NOT_ALLOWED")
        if request.method == "POST":
            origin = request.headers.get("Origin")
            # the host part only: behind a TLS-terminating proxy the scheme differs
            if origin is not None and urlsplit(origin).netloc.lower() != request.host.lower():
                raise PermissionDenied("cross-origin request refused", reason="BAD_ORIGIN")
            if request.content_type != "application/json":
                raise InvalidArgument("body: Content-Type must be application/json",
                                      field="content_type")
        principal = None
        if request.path.startswith("/api/") and request.path != "/api/info":
            principal = self._authenticate(request)
        token = _principal.set(principal)
        try:
            return await handler(request)
        finally:
            _principal.reset(token)

    def _authenticate(self, request: web.Request) -> Principal | None:
        if not self.tokens:
            return None
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else ""
        found = None
        for known, principal in self.tokens.items():  # constant time per token
            if token and hmac.compare_digest(known.encode(), token.encode()):
                found = principal
        if found is None:
            raise Unauthenticated("missing or unknown token (header Authorization: "
                                  "Bearer <admin token>)")
        if found.role != "admin":
            raise PermissionDenied(f"role {found.role!r} may not use the dashboard "
                                   "(admin only)")
        return found

    # -- helpers ---------------------------------------------------------------------
    @staticmethod
    def _call(request: web.Request) -> CallInfo:
        principal = _principal.get()
        supplied = request.headers.get("X-Request-Id", "")
        return CallInfo(actor=principal.identity if principal else "dashboard",
                        request_id=supplied if _REQUEST_ID_RE.match(supplied)
                        else uuid.uuid4().hex)

    #: the JSON object a POST carries (dtq_gateway.web.json_body)
    _body = staticmethod(read_json_object)

    @staticmethod
    def _queue_name(request: web.Request) -> str:
        name = request.match_info["name"]
        if not keys.QUEUE_RE.match(name):
            raise InvalidArgument("queue: queue name must match [A-Za-z0-9_.-]{1,64}",
                                  field="queue")
        return name

    # -- handlers --------------------------------------------------------------------
    async def _serve_static(self, request: web.Request) -> web.Response:
        body, ctype = self._static[request.path]
        return web.Response(body=body, content_type=ctype, charset="utf-8",
                            headers={"Cache-Control": "no-cache"})

    async def _info(self, request: web.Request) -> web.Response:
        s = self.backend.settings
        return web.json_response({"auth_required": bool(self.tokens),
                                  "gateway_id": s.gateway_id})

    async def _queues(self, request: web.Request) -> web.Response:
        q = request.query
        size = api.int_arg(q.get("page_size"), "page_size", 100, 1, api.QUEUES_PAGE_MAX)
        token = validate_queue_page_token(q.get("page_token", ""))
        return web.json_response(await api.queues(self.backend, size, token))

    async def _queue(self, request: web.Request) -> web.Response:
        return web.json_response(await api.queue(self.backend, self._queue_name(request)))

    async def _pause(self, request: web.Request) -> web.Response:
        return await self._set_paused(request, True)

    async def _resume(self, request: web.Request) -> web.Response:
        return await self._set_paused(request, False)

    async def _set_paused(self, request: web.Request, paused: bool) -> web.Response:
        name = self._queue_name(request)
        body = await self._body(request)
        reason = api.str_arg(body.get("reason"), "reason")
        return web.json_response(await api.set_paused(self.backend, name, paused, reason,
                                                      self._call(request)))

    async def _task(self, request: web.Request) -> web.Response:
        return web.json_response(await api.task(self.backend, request.match_info["task_id"]))

    async def _cancel(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        reason = api.str_arg(body.get("reason"), "reason")
        return web.json_response(await api.cancel(
            self.backend, request.match_info["task_id"], reason, self._call(request)))

    async def _recent(self, request: web.Request) -> web.Response:
        q = request.query
        limit = api.int_arg(q.get("limit"), "limit", 50, 1, 1000)
        return web.json_response(await api.recent(self.backend, limit, q.get("queue", ""),
                                                  q.get("status", "")))

    async def _dead_letters(self, request: web.Request) -> web.Response:
        q = request.query
        size = api.int_arg(q.get("page_size"), "page_size", 50, 1, 500)
        token = validate_page_token(q.get("page_token", ""))
        return web.json_response(await api.dead_letters(
            self.backend, size, token, q.get("queue", ""),
            api.str_arg(q.get("task_type"), "task_type", 128),
            api.str_arg(q.get("error_class"), "error_class", 128)))

    async def _requeue(self, request: web.Request) -> web.Response:
        return web.json_response(await api.requeue(
            self.backend, request.match_info["task_id"], self._call(request)))

    async def _discard(self, request: web.Request) -> web.Response:
        return web.json_response(await api.discard(
            self.backend, request.match_info["task_id"], self._call(request)))

    async def _redrive(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        return web.json_response(await api.redrive(self.backend, body, self._call(request)))

    async def _purge(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        return web.json_response(await api.purge_queue(
            self.backend, request.match_info["name"], body, self._call(request)))

    async def _cancel_matching(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        return web.json_response(await api.cancel_matching(self.backend, body,
                                                           self._call(request)))

    async def _search(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        size = api.int_arg(body.get("page_size"), "page_size", 50, 1, 500)
        token = api.str_arg(body.get("page_token"), "page_token", 64)
        return web.json_response(await api.search_tasks(self.backend, body.get("filter"),
                                                        size, token))

    async def _workers(self, request: web.Request) -> web.Response:
        return web.json_response(await api.workers(self.backend))

    async def _audit(self, request: web.Request) -> web.Response:
        q = request.query
        size = api.int_arg(q.get("page_size"), "page_size", 50, 1, 500)
        token = validate_page_token(q.get("page_token", ""))
        return web.json_response(await api.audit(self.backend, size, token))

    async def _events(self, request: web.Request) -> web.StreamResponse:
        return await event_stream(request, self.hub, self._stopping)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.strip().lower() == "localhost"


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["X-Frame-Options"] = "DENY"
    if request.path.startswith("/api/"):
        response.headers["Cache-Control"] = "no-store"

