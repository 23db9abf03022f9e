"""Servers on 127.0.0.1 for the httpclient tests: aiohttp for ordinary HTTP, raw asyncio
servers where a test needs exact bytes on the wire or a misbehaving upstream."""
from __future__ import annotations

import asyncio
import re
from typing import Awaitable, Callable

from aiohttp import web
from yarl import URL

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
EMPTY_200 = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Poll for something another task does; the bound only keeps a failing test finite."""
    for _ in range(int(timeout / 0.005)):
        if cond():
            return True
        await asyncio.sleep(0.005)
    return cond()


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request's head and body. Raw servers read the request before closing, since a
    close with unread bytes makes the kernel send RST instead of FIN."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length: *(\d+)", head)
    return head, await reader.readexactly(int(length[1]) if length else 0)


class RawServer:
    """One asyncio server's connections: how many were accepted and how many have ended."""

    def __init__(self, handler: Handler) -> None:
        self.handler, self.accepted, self.finished = handler, 0, 0
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> RawServer:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    def url(self, path: str = "/") -> URL:
        return URL(f"http://127.0.0.1:{self.port}{path}")

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.writers.append(writer)
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away: what several tests provoke on purpose
        finally:
            self.finished += 1
            writer.close()


async def ok(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=b"ok")


def sent(reply: bytes) -> Handler:
    """A raw handler that reads the request, writes ``reply`` and closes."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply)
        await writer.drain()
    return handler


