"""gateway/httpclient.py: bodies (length, chunked, close-delimited, cut, backpressure) and
keep-alive, against real servers on 127.0.0.1 (tests/gateway/httpservers.py)."""
from __future__ import annotations

import array
import asyncio
import socket
import struct

import pytest
from aiohttp import web
from multidict import CIMultiDict

from gateway.httpclient import HIGH_WATER, Pool, UpstreamError
from tests.gateway.httpservers import ok, read_request, sent, until

# A client bug here tends to be a hang (a body that never ends): fail in seconds, not minutes.
pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def pool(each_pool):
    """Every test here runs against each upstream transport."""
    return each_pool


# ---- bodies ------------------------------------------------------------------------------
async def test_content_length_body_status_headers(web_server, pool):
    async def handler(request: web.Request) -> web.Response:
        headers = CIMultiDict([("Content-Type", "Application/JSON; charset=UTF-8"),
                               ("X-Multi", "a"), ("X-Multi", "b")])
        return web.Response(status=201, body=b'{"x": 1}' * 100, headers=headers)

    base, _ = await web_server(handler)
    resp = await pool.request(base / "v1", [], b"{}")
    assert resp.status == 201
    assert isinstance(resp.headers, CIMultiDict)
    assert resp.headers["content-length"] == "800"
    assert resp.headers.getall("x-multi") == ["a", "b"]
    assert resp.content_type == "application/json"
    assert await resp.read() == b'{"x": 1}' * 100
    assert await resp.readany() == b""  # stays at the end
    resp.release()


async def test_chunked_body_streams_before_it_ends(web_server, pool):
    got = [asyncio.Event(), asyncio.Event()]

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write(b"first")
        # Each next chunk waits until the test has the last one: only a client that hands out
        # bytes before the body ends (and wakes a waiting reader) gets past this.
        for i, part in enumerate((b"second", b"third")):
            await asyncio.wait_for(got[i].wait(), 5)
            await resp.write(part)
        await resp.write_eof()
        return resp

    base, _ = await web_server(handler)
    resp = await pool.request(base, [], b"")
    assert resp.headers["Transfer-Encoding"] == "chunked"
    for i, part in enumerate((b"first", b"second")):
        assert await asyncio.wait_for(resp.readany(), 5) == part
        got[i].set()
    assert await resp.read() == b"third"
    assert await resp.readany() == b""


async def test_close_delimited_body_is_complete(raw_server, pool):
    body = b"no length, no chunks: the body ends when the connection does " * 50
    srv = await raw_server(sent(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n" + body))
    resp = await pool.request(srv.url(), [], b"x")
    assert (resp.status, await resp.read()) == (200, body)


@pytest.mark.parametrize("partial", [
    b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",  # cut between chunks
    b"Transfer-Encoding: chunked\r\n\r\n10\r\nhel",  # cut inside a chunk
    b"Content-Length: 100\r\n\r\nhello",  # cut before Content-Length is reached
])
async def test_cut_mid_body_raises(raw_server, pool, partial):
    srv = await raw_server(sent(b"HTTP/1.1 200 OK\r\n" + partial))
    resp = await pool.request(srv.url(), [], b"x")
    with pytest.raises(UpstreamError):
        await resp.read()  # never a silently shorter body
    with pytest.raises(UpstreamError):
        await resp.readany()  # and it stays failed


async def test_reset_mid_close_delimited_body_raises(raw_server, pool):
    if not isinstance(pool, Pool):
        pytest.skip("aiohttp reads a reset close-delimited body as complete (transport.py)")
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n\r\npartial")
        await writer.drain()
        # SO_LINGER 0: closing sends RST, an abnormal end, unlike a normal close's FIN.
        writer.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    srv = await raw_server(handler)
    resp = await pool.request(srv.url(), [], b"x")
    with pytest.raises(UpstreamError):
        await resp.read()


async def test_backpressure_keeps_all_bytes_in_order(raw_server, pool):
    body = array.array("I", range(2 ** 20)).tobytes()  # 4 MiB; each 4-byte word is unique
    assert len(body) > 8 * HIGH_WATER
    srv = await raw_server(sent(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
                                + body))
    resp = await pool.request(srv.url(), [], b"x")
    if not isinstance(pool, Pool):  # aiohttp's own flow control; only the body is checked
        assert await resp.read() == body
        return
    # No public view of the buffer: the private fields are the only way to see memory bounded.
    assert await until(lambda: resp._paused), "reading never paused"
    buffered = resp._buffered
    await asyncio.sleep(0.05)
    assert resp._buffered == buffered < HIGH_WATER + 2 ** 20  # nothing read while paused
    assert await resp.read() == body


# ---- keep-alive ----------------------------------------------------------------------------
async def test_keepalive_reuse_and_when_not(web_server, pool):
    async def handler(request: web.Request) -> web.Response:
        resp = await ok(request)
        if request.path == "/bye":
            resp.force_close()  # sends Connection: close
        return resp

    base, transports = await web_server(handler)
    if not isinstance(pool, Pool):
        pytest.skip("aiohttp pools a connection at its body's end, before close() is called")

    async def fetch(path: str = "a", read: bool = True, close: bool = False) -> None:
        resp = await pool.request(base / path, [], b"x")
        if read:
            assert await resp.read() == b"ok"
        resp.close() if close else resp.release()

    for _ in range(3):
        await fetch()
    assert len(transports) == 1  # released after a full body: one connection for all
    await fetch(close=True)
    await fetch()
    assert len(transports) == 2  # close() dropped it
    await fetch(read=False)
    await fetch()
    assert len(transports) == 3  # released before the body's end: dropped
    await fetch("bye")
    await fetch()
    assert len(transports) == 4  # the upstream said Connection: close


async def test_stale_response_close_leaves_reused_connection_alone(web_server, pool):
    go = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path != "/second":
            return await ok(request)
        resp = web.StreamResponse()
        resp.content_length = 6
        await resp.prepare(request)
        await asyncio.wait_for(go.wait(), 5)
        await resp.write(b"second")
        return resp

    base, transports = await web_server(handler)
    first = await pool.request(base / "first", [], b"x")
    await first.read()
    first.release()
    second = await pool.request(base / "second", [], b"x")
    assert len(transports) == 1  # the same connection now carries the second response
    first.close()  # e.g. a `finally: close()` after release(): must be a no-op
    go.set()
    # Today second's connection is aborted with its parser already dropped, so read() never
    # ends; the bound turns that hang into a failure.
    assert await asyncio.wait_for(second.read(), 1.0) == b"second"
