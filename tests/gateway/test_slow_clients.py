"""Slow and idle clients cannot hold the gateway: header, body and idle timeouts close them,
a connection cap answers a clear 503, and /healthz and streams keep answering meanwhile."""
from __future__ import annotations

import asyncio
import json
import os
import resource

import aiohttp
from yarl import URL

from benchmarks.rawhttp import exchange, request_bytes
from tests.gateway.conftest import CLIENT_KEY

MSG = [{"role": "user", "content": "hi"}]
AUTH = {"Authorization": f"Bearer {CLIENT_KEY}", "Content-Type": "application/json"}


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _closed_by_peer(reader: asyncio.StreamReader, within: float) -> bytes | None:
    """What the server sent before closing, or None if it kept the socket open."""
    try:
        async with asyncio.timeout(within):
            return await reader.read()
    except TimeoutError:
        return None


async def test_thousand_idle_sockets(make_gateway):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096 <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    gw = await make_gateway(server={"idle_timeout_seconds": 3.0})
    url = URL(gw.url)
    before = _fds()
    socks = [await asyncio.open_connection(url.host, url.port) for _ in range(1000)]
    try:
        await asyncio.sleep(0.2)  # the gateway has accepted them all
        assert gw.runner.server is not None and len(gw.runner.server.connections) >= 1000
        async with aiohttp.ClientSession() as s:
            async with s.get(gw.url + "/healthz") as r:
                assert r.status == 200
        async with gw.client() as client:
            stream = await client.chat.completions.create(
                model="fast", messages=MSG, stream=True, extra_body={"fake": {"ttft_ms": 0}})
            text = "".join([c.choices[0].delta.content or "" async for c in stream
                            if c.choices])
        assert text.startswith("t0 t1")
        # The idle ones are closed by the gateway after idle_timeout_seconds.
        closed = await asyncio.gather(*(_closed_by_peer(r, 10) for r, _ in socks))
        assert all(c == b"" for c in closed)
    finally:
        for _, w in socks:
            w.transport.abort()
    await asyncio.sleep(0.2)
    assert len(gw.runner.server.connections) == 0
    assert _fds() <= before + 4  # the upstream pool may keep a connection


async def test_slow_request_head_gets_408(make_gateway):
    gw = await make_gateway(server={"header_timeout_seconds": 0.5})
    url = URL(gw.url)
    reader, writer = await asyncio.open_connection(url.host, url.port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    for _ in range(3):  # dripping more header bytes does not extend the deadline
        await asyncio.sleep(0.2)
        writer.write(b"X-Drip: 1\r\n")
    got = await _closed_by_peer(reader, 3)
    writer.close()
    assert got is not None and got.startswith(b"HTTP/1.1 408")
    assert json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"


async def test_slow_request_body_gets_408(make_gateway):
    gw = await make_gateway(server={"body_timeout_seconds": 0.5})
    url = URL(gw.url)
    body = json.dumps({"model": "fast", "messages": MSG}).encode()
    data = request_bytes("/v1/chat/completions", body, AUTH)
    r = await exchange(url.host, url.port, data, send_only=len(data) - len(body) // 2,
                       timeout=5)
    assert r.status == 408 and r.json()["error"]["code"] == "request_timeout"
    (row,) = await gw.wait_rows(1)
    assert row["status"] == 408
    assert gw.fake.stats.requests == 0


async def test_connection_cap_answers_503(make_gateway):
    gw = await make_gateway(server={"max_connections": 3})
    url = URL(gw.url)
    held = [await asyncio.open_connection(url.host, url.port) for _ in range(3)]
    await asyncio.sleep(0.1)
    r = await exchange(url.host, url.port, request_bytes("/healthz", b"", {}, "GET"), timeout=5)
    assert r.status == 503 and r.json()["error"]["code"] == "too_many_connections"
    for _, w in held:
        w.close()
    await asyncio.sleep(0.2)
    r = await exchange(url.host, url.port, request_bytes("/healthz", b"", {}, "GET"), timeout=5)
    assert r.status == 200
