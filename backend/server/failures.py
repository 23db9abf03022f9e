"""Failed requests are counted and logged: one log line each and
``backend_request_errors_total{status,code}`` (labels from a fixed set: HTTP statuses and the
server's own error codes). Streams that fail after their headers count as well."""
from __future__ import annotations

import logging

from aiohttp import web
from prometheus_client import Counter

from .errors import FAILURE, Handler
from .state import request_id

log = logging.getLogger("backend.server")
ERROR_COUNTER = web.AppKey("request_errors", Counter)
_MAX_LOGGED = 200  # message characters in the log line (messages may quote client values)


@web.middleware
async def failure_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Outermost: sees the final error of every request, also one sent in-band."""
    try:
        return await handler(request)
    finally:
        err = request.get(FAILURE)
        if err is not None:
            record(request, err.status, err.code, err.message)


def record(request: web.Request, status: int, code: str | None, message: str) -> None:
    counter = request.app.get(ERROR_COUNTER)
    if counter is not None:
        counter.labels(status=str(status), code=code or "none").inc()
    text = message if len(message) <= _MAX_LOGGED else message[:_MAX_LOGGED] + "..."
    # request_id is sanitized (printable, bounded); no header or body value is logged.
    log.log(logging.ERROR if status >= 500 else logging.WARNING,
            "request %s %s %s failed: %d %s: %s", request_id(request), request.method,
            _escaped(request.path[:_MAX_LOGGED]), status, code or "-", _escaped(text))


def _escaped(text: str) -> str:
    """One line, ASCII: client-chosen text can't forge log lines."""
    return text.encode("unicode_escape").decode("ascii")
