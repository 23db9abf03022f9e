"""Connection guards for the backend's HTTP server: slow clients can't hold sockets forever,
too many connections get a clear 503, and malformed requests get a scrubbed 4xx.

aiohttp offers only an idle keep-alive timeout, and its error path for a malformed request
logs a traceback and answers with text that quote the offending header line (a key, when it
is the Authorization header). ``GuardedAppRunner`` swaps in a request handler that adds:
- a header timeout: a connection must deliver a complete request head within
  ``header_timeout_s`` of connecting, or of the first byte after an idle keep-alive;
- a cap on open connections: one over ``max_connections`` gets a 503 and is closed at once
  (before its request is read, so it costs nothing but the accept);
- a one-line log and an OpenAI-shaped body for malformed requests, naming no header value.
The body timeout is applied where the body is read (``protocol.read_body``).
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_server import Server

log = logging.getLogger("backend.server")
_REFUSED_LINGER_S = 1.0


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0
    keepalive_timeout_s: float = 30.0
    max_connections: int = 2048


def _error_bytes(status: int, message: str, code: str, type_: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": None,
                                 "code": code}}).encode()


class GuardedRequestHandler(RequestHandler):
    """aiohttp's protocol with a header timer, the connection cap and scrubbed errors."""

    limits: ConnectionLimits
    guard: "GuardedServer"
    _refused = False
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.guard.open_connections >= self.limits.max_connections:
            self._refused = True
            body = _error_bytes(503, f"the server holds its maximum of "
                                f"{self.limits.max_connections} connections; retry shortly",
                                "too_many_connections", "server_error")
            transport.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: "
                            b"application/json\r\nRetry-After: 1\r\nConnection: close\r\n"
                            b"Content-Length: %d\r\n\r\n" % len(body) + body)
            # Half-close now, close a moment later: closing at once would reset the
            # connection if the client's request arrives afterwards, and a reset can destroy
            # the 503 before the client reads it. Its bytes are ignored meanwhile.
            if transport.can_write_eof():
                transport.write_eof()
            self._loop.call_later(_REFUSED_LINGER_S, transport.close)
            self.guard.refused_total += 1
            return
        self.guard.open_connections += 1
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._refused:
            return
        self.guard.open_connections -= 1
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        # The first bytes after an idle keep-alive start a new request head: time it.
        if self._head_timer is None and not self._request_in_progress:
            self._arm_head_timer()
        before = self._request_count
        super().data_received(data)
        if self._request_count != before:  # a whole head arrived
            self._cancel_head_timer()

    def eof_received(self) -> bool | None:
        return None if self._refused else super().eof_received()

    def _arm_head_timer(self) -> None:
        self._head_timer = self._loop.call_later(self.limits.header_timeout_s,
                                                 self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._request_in_progress:
            self.guard.header_timeouts_total += 1
            self.force_close()

    def handle_error(self, request: BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        # aiohttp's own version logs a traceback and answers with exc's text, both of which
        # quote the raw header line; say what class of error it was, never the bytes.
        log.warning("malformed HTTP request from %s: %d %s", request.remote, status,
                    type(exc).__name__ if exc is not None else "error")
        if request.writer.output_size > 0:
            raise ConnectionError("the response is under way; the connection is broken")
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ \
            else "Error"
        kind = "server_error" if status >= 500 else "invalid_request_error"
        text = "the request is not valid HTTP/1.1 (a header name or value holds a byte " \
            "that is not allowed, or a line is too long)" if status < 500 else phrase
        resp = web.Response(status=status, body=_error_bytes(status, text,
                                                             "invalid_http_request", kind),
                            content_type="application/json")
        resp.force_close()
        return resp


class GuardedServer(Server):
    """aiohttp's Server, building GuardedRequestHandler protocols."""

    limits: ConnectionLimits
    open_connections: int
    refused_total: int
    header_timeouts_total: int

    def __call__(self) -> RequestHandler:
        handler = GuardedRequestHandler(self, loop=self._loop, **self._kwargs)
        handler.limits, handler.guard = self.limits, self
        return handler


class GuardedAppRunner(web.AppRunner):
    """An AppRunner whose server is a GuardedServer with the given limits."""

    def __init__(self, app: web.Application, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(app, keepalive_timeout=limits.keepalive_timeout_s, **kwargs)
        self._limits = limits

    async def _make_server(self) -> Server:
        server = await super()._make_server()
        # aiohttp has no parameter for the protocol class; the Server built by the app is
        # kept whole and only its class (its __call__) changes.
        server.__class__ = GuardedServer
        server.limits = self._limits
        server.open_connections = server.refused_total = server.header_timeouts_total = 0
        return server
