"""CPU per upstream request: aiohttp's client against the gateway's own (gateway/httpclient.py).

    .venv/bin/python -m benchmarks.upstream_client [--requests 3000]

One process, one event loop: a minimal HTTP server (an asyncio Protocol that answers every
request with the same short chunked SSE body) and the client under test, one request at a time
over a kept-alive connection. Reported: process CPU time per request-response cycle (client and
server together; the server's share is the same for every client) and, as the floor, the same
cycle with one ``transport.write`` of prebuilt request bytes. This is why the gateway does not
use aiohttp's client upstream (docs/GATEWAY.md, "Process notes").
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Awaitable, Callable

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from gateway.httpclient import Pool

BODY = json.dumps({"model": "m", "stream": True,
                   "messages": [{"role": "user", "content": "hi"}]}).encode()
_EVENT = b"data: [DONE]\n\n"
REPLY = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
         b"\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(_EVENT), _EVENT))
HEADERS = {"Content-Type": "application/json", "x-request-id": "abc", "Authorization": "Bearer x"}


class _Server(asyncio.Protocol):
    """Answers each complete request (headers + the known body length) with REPLY."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport, self.buf = transport, b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        head, sep, rest = self.buf.partition(b"\r\n\r\n")
        if sep and len(rest) >= len(BODY):
            self.buf = rest[len(BODY):]
            self.transport.write(REPLY)  # type: ignore[attr-defined]


async def _cpu_per_call(call: Callable[[], Awaitable[None]], n: int) -> float:
    for _ in range(min(300, n)):  # warm: connection made, code paths hot
        await call()
    c0 = time.process_time()
    for _ in range(n):
        await call()
    return (time.process_time() - c0) / n * 1e6


async def run(n: int) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Server, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = URL(f"http://127.0.0.1:{port}/v1/chat/completions")
    out: dict[str, float] = {}

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), trust_env=False,
                                    cookie_jar=aiohttp.DummyCookieJar())

    async def with_aiohttp() -> None:
        r = await session.post(url, data=BODY, headers=CIMultiDict(HEADERS),
                               allow_redirects=False)
        while await r.content.readany():
            pass
        r.release()

    out["aiohttp_client_us"] = await _cpu_per_call(with_aiohttp, n)
    await session.close()

    pool = Pool()

    async def with_pool() -> None:
        r = await pool.request(url, HEADERS.items(), BODY)
        while await r.readany():
            pass
        r.release()

    out["gateway_httpclient_us"] = await _cpu_per_call(with_pool, n)
    await pool.close()

    done: list[asyncio.Future[None]] = []

    class _Raw(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            if data.endswith(b"0\r\n\r\n"):
                done[-1].set_result(None)

    transport, _ = await loop.create_connection(_Raw, "127.0.0.1", port)
    raw = (f"POST {url.raw_path_qs} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
           + "".join(f"{k}: {v}\r\n" for k, v in HEADERS.items())
           + f"Content-Length: {len(BODY)}\r\n\r\n").encode() + BODY

    async def floor() -> None:
        done.append(loop.create_future())
        transport.write(raw)
        await done[-1]

    out["one_write_floor_us"] = await _cpu_per_call(floor, n)
    transport.close()
    server.close()
    return {k: round(v, 1) for k, v in out.items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.upstream_client",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=3000)
    a = p.parse_args(argv)
    import uvloop
    result = uvloop.run(run(a.requests))
    print(json.dumps({"requests": a.requests, "cpu_per_request": result,
                      "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))


if __name__ == "__main__":
    main()
