"""gateway/transport.py: both transports resend once on a kept-alive connection that died while
idle, ``fast`` hands proxied origins to ``aiohttp``, and a real forward proxy (Debian's
tinyproxy) carries the gateway's upstream traffic."""
from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from gateway.config import TRANSPORTS
from gateway.httpclient import UpstreamError
from gateway.transport import Transports
from loadtests.procs import free_port, stop_process
from tests.gateway.conftest import CLIENT_KEY, make_pool
from tests.gateway.httpservers import EMPTY_200, read_request

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def pool(each_pool):
    """Every test here runs against each upstream transport."""
    return each_pool


async def test_reused_connection_dead_before_first_byte_is_resent_once(raw_server, pool):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(EMPTY_200)  # keep-alive: the client pools this connection
        await writer.drain()
        if srv.accepted == 1:
            await read_request(reader)  # the reuse arrives just as the server gives up on it
            return  # closed without a byte of an answer
        while True:  # the fresh connection serves everything after
            await read_request(reader)
            writer.write(EMPTY_200)
            await writer.drain()

    srv = await raw_server(handler)
    for _ in range(2):
        resp = await pool.request(srv.url(), [], b"x")
        assert resp.status == 200
        assert await resp.read() == b""
        resp.release()
    assert srv.accepted == 2  # the resend went out on a new connection at once


async def test_fresh_connection_dead_before_first_byte_is_an_error(raw_server, pool):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)  # then close: no answer

    srv = await raw_server(handler)
    with pytest.raises(UpstreamError):
        await pool.request(srv.url(), [], b"x")
    assert srv.accepted == 1  # not resent: upstream.py's retry policy decides


async def test_aiohttp_keeps_alive_and_drops_an_unfinished_body(web_server):
    async def slow(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse()
        resp.content_length = 4
        await resp.prepare(request)
        await resp.write(b"ok")
        await asyncio.sleep(0.1)  # the body is unfinished for a while
        await resp.write(b"ok")
        return resp

    base, transports = await web_server(slow)
    pool = make_pool("aiohttp")
    try:
        for _ in range(3):
            resp = await pool.request(base / "a", [], b"x")
            assert await resp.read() == b"okok"
            resp.release()
        assert len(transports) == 1
        resp = await pool.request(base / "a", [], b"x")
        resp.close()  # before its body ended: the connection goes
        resp = await pool.request(base / "a", [], b"x")
        assert await resp.read() == b"okok"
        assert len(transports) == 2
    finally:
        await pool.close()


class _P:
    def __init__(self, root: str, transport: str) -> None:
        self.root = root
        self.config = type("C", (), {"transport": transport})()


async def test_fast_falls_back_to_aiohttp_where_a_proxy_applies(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:3128")
    monkeypatch.setenv("NO_PROXY", "internal.example")
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    monkeypatch.delenv("http_proxy", raising=False)
    monkeypatch.delenv("https_proxy", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    t = Transports([_P("https://cloud.example/api", "fast"),
                    _P("https://internal.example", "fast"),
                    _P("http://127.0.0.1:8000", "fast"),
                    _P("http://127.0.0.1:9000", "aiohttp")])
    try:
        assert t.for_url(URL("https://cloud.example/api/v1/x")) is t.aiohttp  # proxied
        assert t.for_url(URL("https://internal.example/v1/x")) is t.fast      # NO_PROXY
        assert t.for_url(URL("http://127.0.0.1:8000/v1/x")) is t.fast         # no http proxy
        assert t.for_url(URL("http://127.0.0.1:9000/v1/x")) is t.aiohttp      # configured
    finally:
        await t.close()


@pytest.fixture
def tinyproxy(tmp_path: Path):
    exe = shutil.which("tinyproxy")
    if exe is None:
        pytest.fail("tinyproxy is not installed (tests/system-packages.txt lists it)")
    port = free_port()
    conf = tmp_path / "tinyproxy.conf"
    conf.write_text(f"Port {port}\nListen 127.0.0.1\nTimeout 60\nAllow 127.0.0.1\n"
                    f"LogLevel Info\nMaxClients 64\n")
    proc = subprocess.Popen([exe, "-d", "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert proc.poll() is None, "tinyproxy exited"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc, grace_s=5)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_real_forward_proxy_carries_upstream_traffic(make_gateway, tinyproxy,
                                                             monkeypatch, transport):
    # "fast" is configured in one run: the proxy variable makes it fall back to aiohttp.
    monkeypatch.setenv("HTTP_PROXY", tinyproxy)
    monkeypatch.delenv("http_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    gw = await make_gateway()
    body = {"model": "fast", "stream": True, "messages": [{"role": "user", "content": "hi"}],
            "fake": {"ttft_ms": 1, "itl_ms": 1, "tokens": 3}}
    async with aiohttp.ClientSession() as s:  # trust_env off: straight to the gateway
        async with s.post(gw.url + "/v1/chat/completions", json=body,
                          headers={"Authorization": f"Bearer {CLIENT_KEY}"}) as r:
            assert r.status == 200
            assert (await r.read()).rstrip().endswith(b"data: [DONE]")
    via = gw.fake.last().headers.get("Via", "")
    assert "tinyproxy" in via  # the request reached the upstream through the proxy
    (row,) = await gw.wait_rows(1)
    assert row["status"] == 200 and row["ttft_s"] is not None
