"""The gateway's HTTP server side: slow-client timeouts, a connection cap, and protocol errors
that never echo what the client sent.

aiohttp's own handling of a request it cannot parse logs a traceback and answers a text body,
and both quote the offending header line, i.e. possibly a client's key. :class:`GuardedHandler`
answers such requests with a fixed OpenAI-style 400 and logs one line naming only the error's
class. It also closes connections that send a request head too slowly (``header_timeout``),
and :class:`GuardedServer` answers connections above ``max_connections`` with a 503 before
reading anything, so a flood of idle sockets cannot starve ``/healthz`` of file descriptors.

This subclasses aiohttp's ``RequestHandler`` and reads a few of its attributes
(``_request_count``, ``_manager``, ``_loop``); tests/gateway/test_slow_clients.py and
test_canary.py fail if a new aiohttp changes them.
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

log = logging.getLogger("gateway.server")


@dataclass(frozen=True)
class Guard:
    header_timeout: float      # first byte of a request head -> its end
    max_connections: int       # open client connections; more get a 503 at once


def _raw_response(status: int, reason: str, message: str, code: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error"
                                 if status < 500 else "server_error",
                                 "param": None, "code": code}}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


BUSY = _raw_response(503, "Service Unavailable", "The gateway has too many open connections; "
                     "retry shortly.", "too_many_connections")
HEAD_TIMEOUT = _raw_response(408, "Request Timeout", "The request head was not received in "
                             "time.", "request_timeout")
_BAD_REQUEST_BODY = {"error": {"message": "Malformed HTTP request (request line or headers).",
                               "type": "invalid_request_error", "param": None,
                               "code": "bad_http_request"}}
_LINGER_S = 1.0  # a refused connection: how long its request may still arrive before closing


class GuardedHandler(RequestHandler):
    """aiohttp's per-connection protocol with a header-read timeout, a connection cap, and
    protocol-error answers that contain nothing the client sent."""

    def __init__(self, manager: "GuardedServer", **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = manager.guard
        self._refused = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._served = 0  # responses finished on this connection

    # ---- connection cap ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        manager: GuardedServer = self._manager  # type: ignore[assignment]
        if manager.open_connections() >= self._guard.max_connections:
            self._refused = True
            t: asyncio.Transport = transport  # type: ignore[assignment]
            t.write(BUSY)
            # Half-close and keep reading briefly: closing with the request unread would
            # send a reset that can destroy the 503 before the client reads it.
            if t.can_write_eof():
                t.write_eof()
            self._head_timer = self._loop.call_later(_LINGER_S, t.close)
            self.transport = t
            return
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel_head_timer()
        if self._refused:
            self.transport = None
            return
        super().connection_lost(exc)

    def eof_received(self) -> None:
        if not self._refused:
            super().eof_received()
        elif self.transport is not None:  # the refused client is done sending: close now
            self.transport.close()

    # ---- header-read timeout -------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        heads = self._request_count
        super().data_received(data)
        if self._request_count != heads:  # a request head completed: its timer stops
            self._cancel_head_timer()
        elif self._head_timer is None and self._request_count == self._served and data:
            # Bytes of a new request head (not the body of one being served).
            self._head_timer = self._loop.call_later(self._guard.header_timeout,
                                                     self._head_timed_out)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport is not None and self._request_count == self._served:
            self.transport.write(HEAD_TIMEOUT)
            self.force_close()

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    async def finish_response(self, request: Any, resp: Any,
                              start_time: float | None) -> tuple[Any, bool]:
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self._served += 1

    # ---- errors that must not echo the request -------------------------------------------
    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0:  # as aiohttp: a started response cannot change
            raise ConnectionError("response already started; cannot send an error")
        if status < 500:  # the client sent something we cannot parse
            log.info("rejected a malformed HTTP request (%s)", type(exc).__name__)
            body = _BAD_REQUEST_BODY
        else:  # only reached outside the gateway's middleware, which answers its own errors
            log.error("HTTP %d outside a handler (%s)", status, type(exc).__name__)
            body = {"error": {"message": "Internal gateway error.", "type": "server_error",
                              "param": None, "code": "internal_error"}}
        resp = web.json_response(body, status=status)
        resp.force_close()
        return resp

    def log_exception(self, *args: Any, **kw: Any) -> None:
        # aiohttp's messages may carry exception text that quotes request bytes: log the
        # event and the exception's class only.
        exc = kw.get("exc_info")
        what = args[0] if args and isinstance(args[0], str) else "error"
        # A body the client broke (bad gzip, cut chunking) is the client's fault, already
        # answered with a 400: not worth a warning when aiohttp trips on it again.
        level = logging.INFO if isinstance(exc, web.RequestPayloadError) else logging.WARNING
        log.log(level, "%s (%s)", what.split(" from ")[0],
                type(exc).__name__ if isinstance(exc, BaseException) else "no exception")


class GuardedServer(web.Server):
    """aiohttp's connection factory, making :class:`GuardedHandler` protocols."""

    def __init__(self, *args: Any, guard: Guard, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = guard

    def open_connections(self) -> int:
        return len(self._connections)

    def __call__(self) -> RequestHandler:
        return GuardedHandler(self, loop=self._loop, **self._kwargs)


class GatewayRunner(web.AppRunner):
    """An AppRunner whose server is a :class:`GuardedServer`."""

    def __init__(self, app: web.Application, *, guard: Guard, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._guard = guard

    async def _make_server(self) -> web.Server:
        base = await super()._make_server()  # runs the app's startup, freezes it
        kwargs = dict(self._kwargs)
        return GuardedServer(base.request_handler, request_factory=base.request_factory,
                             loop=asyncio.get_running_loop(), guard=self._guard, **kwargs)
