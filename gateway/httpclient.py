"""The gateway's HTTP/1.1 client for upstream calls: a keep-alive pool, TLS, llhttp parsing.

Why not aiohttp's client (the gateway's server stays aiohttp): on Python 3.11 it sends every
request body from a task of its own, i.e. one more turn of the event loop before the request
leaves, and spends ~45 µs of CPU building each request; on a gateway relaying thousands of
events a second both land on the time to first token. Here the request goes out in one
``transport.write`` the moment :meth:`Pool.request` is called, and body bytes reach the relay
as they arrive (``httptools`` does the HTTP framing, in C).

Errors before or during the body are :class:`UpstreamError`; a connection that is cut before a
response completes never looks like a finished body.
"""
from __future__ import annotations

import asyncio
import collections
import ssl
import time
from typing import Iterable

import httptools
from multidict import CIMultiDict
from yarl import URL

# Unread body bytes above which the upstream socket stops being read (the client is slower
# than the upstream): TCP flow control then slows the upstream instead of our memory growing.
HIGH_WATER = 2 ** 17


class UpstreamError(Exception):
    """The upstream connection failed: refused, reset, closed early, or not valid HTTP."""


class Response:
    """One upstream response: status and headers, then the body as it arrives."""

    def __init__(self, conn: "_Connection") -> None:
        self._conn = conn
        self.status = 0
        self.headers: CIMultiDict[str] = CIMultiDict()
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._eof = False
        self._exc: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._discard: asyncio.TimerHandle | None = None  # see release_after_body

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()

    async def readany(self) -> bytes:
        """Whatever body bytes have arrived (waiting for some); b"" once the body is complete."""
        while not self._chunks:
            if self._exc is not None:
                raise self._exc
            if self._eof:
                return b""
            self._waiter = self._conn.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        if self._paused:
            self._paused = False
            if not self._conn.closed:
                self._conn.transport.resume_reading()
        return data

    async def read(self) -> bytes:
        parts = []
        while data := await self.readany():
            parts.append(data)
        return b"".join(parts)

    def release(self) -> None:
        """Done with it: the connection goes back to the pool if the body was read to its end."""
        if self._conn.response is self:  # not after release(): the connection may be reused
            self._conn.finish(reuse=self._eof and self._exc is None and not self._chunks)

    def release_after_body(self, timeout: float) -> None:
        """Done with it, though the body's end may still be arriving (the bytes after an SSE
        ``[DONE]``): discard the rest and return the connection to the pool when the body ends,
        or drop it after ``timeout`` seconds. No task waits for it."""
        if self._eof or self._exc is not None or self._conn.closed:
            self.release()
            return
        self._chunks.clear()
        self._buffered = 0
        self._discard = self._conn.loop.call_later(timeout, self.close)
        if self._paused:
            self._paused = False
            self._conn.transport.resume_reading()

    def close(self) -> None:
        """Drop the connection now (the upstream sees the disconnect and can stop generating)."""
        if self._conn.response is self:
            self._conn.finish(reuse=False)

    # ---- fed by the connection -------------------------------------------------------------
    def _feed(self, data: bytes) -> None:
        if self._discard is not None:
            return
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > HIGH_WATER and not self._paused:
            self._paused = True
            self._conn.transport.pause_reading()
        self._wake()

    def _end(self, exc: UpstreamError | None = None) -> None:
        if exc is None:
            self._eof = True
        elif not self._eof:
            self._exc = exc
        self._wake()
        if self._discard is not None:  # released after its body: the body is over now
            self._discard.cancel()
            self._discard = None
            self.release()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection; at most one request at a time (no pipelining)."""

    def __init__(self, pool: "Pool", key: tuple[str, str, int]) -> None:
        self.pool, self.key = pool, key
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # connection_made
        self.response: Response | None = None
        self.headers_done: asyncio.Future[None] | None = None
        self.parser: httptools.HttpResponseParser | None = None
        self.closed = False
        self.keep_alive = False
        self.until_close = False  # body delimited by the connection's end (no length, no chunks)
        self.idle_since = 0.0
        self.answered = False     # a byte of the current response arrived

    # ---- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.parser is None:  # bytes while idle: the connection is no longer usable
            self.transport.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"invalid HTTP from upstream: {exc}"))
            self.transport.close()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        if (self.parser is not None and self.until_close and self.response is not None
                and exc is None):  # a reset is not a clean end
            self.parser = None  # a body delimited by the connection's end is complete now
            self.response._end()
        elif self.parser is not None:  # still inside a response: it was cut
            self._fail(UpstreamError("upstream closed the connection before the response "
                                     "completed"))

    # ---- httptools callbacks -----------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.answered = True

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.response is not None
        self.response.headers.add(name.decode("latin-1"), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        assert self.response is not None and self.parser is not None
        self.response.status = self.parser.get_status_code()
        if 100 <= self.response.status < 200:  # interim (103 Early Hints ...): not the answer
            return
        h = self.response.headers
        self.until_close = ("Content-Length" not in h and "Transfer-Encoding" not in h
                            and self.response.status not in (204, 304))
        if self.headers_done is not None and not self.headers_done.done():
            self.headers_done.set_result(None)

    def on_body(self, body: bytes) -> None:
        assert self.response is not None
        self.response._feed(body)

    def on_message_complete(self) -> None:
        assert self.response is not None and self.parser is not None
        if 100 <= self.response.status < 200:  # the final response follows on this parser
            self.response.status, self.response.headers = 0, CIMultiDict()
            return
        self.keep_alive = self.parser.should_keep_alive()
        self.parser = None
        self.response._end()

    # ---- request / release -----------------------------------------------------------------
    def send(self, head: bytes, body: bytes) -> Response:
        self.response = Response(self)
        self.parser = httptools.HttpResponseParser(self)
        self.keep_alive = self.until_close = self.answered = False
        self.headers_done = self.loop.create_future()
        self.transport.write(head + body)  # one send: headers and body leave together
        return self.response

    def _fail(self, exc: UpstreamError) -> None:
        self.parser = None
        if self.headers_done is not None and not self.headers_done.done():
            self.headers_done.set_exception(exc)
        if self.response is not None:
            self.response._end(exc)

    def finish(self, reuse: bool) -> None:
        if self.response is None:
            return
        self.response = None
        self.headers_done = None
        if reuse and self.keep_alive and self.parser is None and not self.closed:
            self.pool.put(self)
        else:
            self.parser = None
            if not self.closed:
                self.transport.abort()


class Pool:
    """Keep-alive connections per (scheme, host, port); no limit (clients bound concurrency)."""

    def __init__(self, keepalive_seconds: float = 30.0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        """``ssl_context``: for HTTPS upstreams (default: the system's trust store)."""
        self.keepalive_seconds = keepalive_seconds
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._ssl = ssl_context
        self._open: set[_Connection] = set()
        self._sweeper: asyncio.TimerHandle | None = None

    async def request(self, url: URL, headers: Iterable[tuple[str, str]], body: bytes,
                      connect_timeout: float | None = None) -> Response:
        """POST ``body`` to ``url``; returns once the response headers are in."""
        head = _head(url, headers, len(body))  # refused headers must not take a connection
        conn = await self._get(url, connect_timeout)
        reused = conn.idle_since > 0  # it sat in the pool: the upstream may have closed it
        resp = conn.send(head, body)
        try:
            await conn.headers_done  # type: ignore[misc]
        except UpstreamError:
            resp.close()
            if not reused or conn.answered:
                raise
            # Died while idle, before a byte of the answer: once more at once, on a new one.
            conn = await self._connect(conn.key, connect_timeout)
            resp = conn.send(head, body)
            try:
                await conn.headers_done  # type: ignore[misc]
            except BaseException:
                resp.close()
                raise
        except BaseException:
            resp.close()
            raise
        return resp

    async def _get(self, url: URL, connect_timeout: float | None) -> _Connection:
        key = (url.scheme, url.host or "", url.port or (443 if url.scheme == "https" else 80))
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()  # most recent first: the least likely to have been closed
            if not conn.closed and now - conn.idle_since < self.keepalive_seconds:
                return conn
            conn.transport.close()
        return await self._connect(key, connect_timeout)

    async def _connect(self, key: tuple[str, str, int], timeout: float | None) -> _Connection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        tls = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            tls = self._ssl
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self, key), host, port, ssl=tls,
                    server_hostname=host if tls else None)
        except TimeoutError:
            raise UpstreamError(f"connect to {host}:{port} timed out") from None
        except OSError as exc:  # refused, unreachable, DNS, TLS handshake (ssl.SSLError)
            raise UpstreamError(f"cannot connect to {host}:{port}: "
                                f"{type(exc).__name__}") from None
        self._open.add(conn)
        return conn

    def put(self, conn: _Connection) -> None:
        conn.idle_since = time.monotonic()
        self._idle.setdefault(conn.key, []).append(conn)  # oldest first
        if self._sweeper is None:
            self._sweeper = conn.loop.call_later(self.keepalive_seconds, self._sweep)

    def _sweep(self) -> None:
        """Close connections idle for keepalive_seconds, so a burst of streams does not leave
        its connections open after the traffic is gone (the upstream holds them too)."""
        self._sweeper = None
        cutoff = time.monotonic() - self.keepalive_seconds
        left = False
        for idle in self._idle.values():
            while idle and idle[0].idle_since <= cutoff:
                idle.pop(0).transport.close()
            left = left or bool(idle)
        if left:
            self._sweeper = asyncio.get_running_loop().call_later(
                self.keepalive_seconds / 2, self._sweep)

    def counts(self) -> tuple[int, int]:
        """(open connections, those of them idle in the pool): a leak check's numbers."""
        return len(self._open), sum(len(idle) for idle in self._idle.values())

    def forget(self, conn: _Connection) -> None:
        self._open.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self._open):
            conn.transport.abort()
        self._open.clear()
        self._idle.clear()
        await asyncio.sleep(0)  # let connection_lost callbacks run


def _head(url: URL, headers: Iterable[tuple[str, str]], length: int) -> bytes:
    """Request line and headers. Values with CR/LF are refused (no header injection)."""
    host = url.host_subcomponent or ""  # IPv6 in brackets
    if url.explicit_port is not None:
        host = f"{host}:{url.explicit_port}"
    lines = [f"POST {url.raw_path_qs} HTTP/1.1", f"Host: {host}",
             f"Content-Length: {length}"]
    for name, value in headers:
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise UpstreamError(f"header {name!r} has a line break")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")
