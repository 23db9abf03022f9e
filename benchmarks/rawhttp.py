"""A raw-socket HTTP/1.1 client for hostile and abortive exchanges: it sends exactly the bytes
given (control bytes in headers, half a body, ...) and can hang up at a chosen moment, which
no well-behaved client library allows. Responses are parsed with ``httptools``.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import httptools


@dataclass
class Reply:
    status: int = 0                 # 0: no response head arrived
    headers: dict[str, str] = field(default_factory=dict)  # names lower-cased
    body: bytes = b""
    complete: bool = False          # the whole response arrived
    timed_out: bool = False         # nothing more came within the timeout

    def json(self) -> Any:
        return json.loads(self.body)


class _Collector:
    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.parts: list[bytes] = []
        self.head_done = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.reply.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)

    def on_message_complete(self) -> None:
        self.reply.complete = True


def request_bytes(path: str, body: bytes, headers: dict[str, bytes | str] | None = None,
                  method: str = "POST", content_length: int | None = None) -> bytes:
    """A request head (and body) with the given header values sent byte for byte."""
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: 127.0.0.1"]
    for name, value in (headers or {}).items():
        lines.append(name.encode() + b": " + (value if isinstance(value, bytes)
                                              else value.encode()))
    if method == "POST":
        n = len(body) if content_length is None else content_length
        lines.append(b"Content-Length: %d" % n)
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


async def exchange(host: str, port: int, data: bytes, *, timeout: float = 30.0,
                   send_only: int | None = None, abort_after_s: float | None = None,
                   abort_at_head: bool = False, abort_at: bytes | None = None) -> Reply:
    """Send ``data`` (only its first ``send_only`` bytes if given) and read the reply.

    Hang up (a reset) ``abort_after_s`` seconds after sending, when the response head has
    arrived (``abort_at_head``), or once the body contains ``abort_at``; otherwise read to the
    response's end, or until nothing arrives for ``timeout`` seconds (``timed_out``).
    """
    reply = Reply()
    col = _Collector(reply)
    parser = httptools.HttpResponseParser(col)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(data if send_only is None else data[:send_only])
        loop = asyncio.get_running_loop()
        give_up = None if abort_after_s is None else loop.time() + abort_after_s
        while not reply.complete:
            planned = give_up is not None and give_up - loop.time() <= timeout
            wait = give_up - loop.time() if planned else timeout  # type: ignore[operator]
            if wait <= 0:
                break
            try:
                async with asyncio.timeout(wait):
                    chunk = await reader.read(65536)
            except TimeoutError:
                reply.timed_out = not planned  # else: the planned hang-up
                break
            except ConnectionError:
                break
            if not chunk:
                break
            try:
                parser.feed_data(chunk)
            except httptools.HttpParserUpgrade:
                break
            except httptools.HttpParserError:
                break
            if col.head_done and not reply.status:
                reply.status = parser.get_status_code()
            if abort_at_head and col.head_done:
                break
            if abort_at is not None and abort_at in b"".join(col.parts):
                break
        if col.head_done and not reply.status:
            reply.status = parser.get_status_code()
    finally:
        reply.body = b"".join(col.parts)
        if not reply.complete:
            writer.transport.abort()  # a hang-up mid-exchange: what an impatient client does
        else:
            writer.close()
    return reply
