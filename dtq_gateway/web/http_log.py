"""The dashboard's HTTP server log: a client's malformed request is not an ERROR."""

from __future__ import annotations

import logging
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

from dtq_gateway import metrics


class HttpServerLog(logging.LoggerAdapter):
    """aiohttp's server logger, with a client's malformed request kept out of ERROR.

    aiohttp logs every request it cannot parse (garbage bytes, a bad request line, a
    bad or oversized header) with ``logger.exception``: ERROR and a traceback, for what
    is the client's mistake (it answers 400 and closes the connection). Those go to
    DEBUG without a traceback here, counted in
    ``dtq_dashboard_malformed_requests_total``; anything else aiohttp reports (a
    handler error it caught itself) stays at ERROR.
    """

    def exception(self, msg: object, *args: object, exc_info: Any = True,
                  **kwargs: Any) -> None:
        """Log ``msg`` at ERROR with the traceback, or, for a client's malformed
        request (an HttpProcessingError with a 4xx code), count it and log at DEBUG."""
        if not self._client_mistake(exc_info):
            self.logger.error(msg, *args, exc_info=exc_info, **kwargs)

    def debug(self, msg: object, *args: object, **kwargs: Any) -> None:
        """aiohttp's DEBUG (a first request that is not HTTP at all): counted like
        :meth:`exception`, and without a traceback."""
        if not self._client_mistake(kwargs.get("exc_info")):
            self.logger.debug(msg, *args, **kwargs)

    def _client_mistake(self, exc: Any) -> bool:
        """Count and log (DEBUG, one line) a malformed request; False for anything else."""
        if not isinstance(exc, HttpProcessingError) or not 400 <= (exc.code or 400) < 500:
            return False
        metrics.DASHBOARD_MALFORMED_REQUESTS.inc()
        self.logger.debug("dashboard: malformed HTTP request: %s",
                          exc.message.splitlines()[0] if exc.message else type(exc).__name__)
        return True

#: aiohttp's own server logger ("aiohttp.server"), through :class:`HttpServerLog`.
SERVER_LOG = HttpServerLog(logging.getLogger("aiohttp.server"), {})
