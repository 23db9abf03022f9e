"""gateway/httpclient.py: failures (refused, invalid HTTP, 1xx, connect timeout), the request
on the wire, header injection, TLS, Pool.close; real servers on 127.0.0.1."""
from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import ssl
import subprocess

import pytest
from yarl import URL

from gateway.httpclient import Pool, UpstreamError
from tests.gateway.httpservers import EMPTY_200, Handler, RawServer, ok, read_request, sent, until

# A client bug here tends to be a hang (a body that never ends): fail in seconds, not minutes.
pytestmark = pytest.mark.timeout(10)


# ---- failures ------------------------------------------------------------------------------
async def test_connection_refused(pool):
    with socket.socket() as s:  # a port that was free a moment ago, with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(UpstreamError, match="cannot connect"):
        await pool.request(URL(f"http://127.0.0.1:{port}/"), [], b"x")


@pytest.mark.parametrize("reply", [b"garbage\r\n\r\n",
                                   b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
                                   b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"])
async def test_invalid_http_raises(raw_server, pool, reply):
    srv = await raw_server(sent(reply))
    with pytest.raises(UpstreamError):
        resp = await pool.request(srv.url(), [], b"x")
        await resp.read()


async def test_interim_1xx_response_is_skipped(raw_server, pool):
    srv = await raw_server(sent(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
                                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
    resp = await pool.request(srv.url(), [], b"x")
    assert (resp.status, await resp.read()) == (200, b"ok")


async def test_connect_timeout(pool):
    """Linux drops SYNs to a listener whose accept queue is full, so connect() hangs."""
    with contextlib.ExitStack() as sockets:
        listener = sockets.enter_context(socket.socket())
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        for _ in range(10):  # connect until one hangs: then the queue is full
            (s := sockets.enter_context(socket.socket())).setblocking(False)
            try:
                await asyncio.wait_for(asyncio.get_running_loop().sock_connect(
                    s, listener.getsockname()), 0.2)
            except TimeoutError:
                break
        else:
            pytest.skip("could not fill the accept queue on this kernel")
        url = URL(f"http://127.0.0.1:{listener.getsockname()[1]}/")
        with pytest.raises(UpstreamError, match="timed out"):
            await pool.request(url, [], b"x", connect_timeout=0.2)


# ---- the request on the wire ---------------------------------------------------------------
async def test_request_bytes_on_the_wire(raw_server, pool):
    received: list[tuple[bytes, bytes, bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head, body = await read_request(reader)
        writer.write(EMPTY_200)
        received.append((head, body, await reader.read()))  # the rest, until the pool closes

    srv = await raw_server(handler)
    url = URL(f"http://127.0.0.1:{srv.port}/v1/chat/completions?a=1&b=x%20y", encoded=True)
    body = b'{"model": "m"}'
    resp = await pool.request(url, [("Authorization", "Bearer k"), ("X-Request-Id", "r1")], body)
    assert await resp.read() == b""
    resp.release()
    await pool.close()
    assert await until(lambda: srv.finished == 1)
    assert srv.accepted == 1
    [(head, got_body, rest)] = received
    request_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
    assert request_line == "POST /v1/chat/completions?a=1&b=x%20y HTTP/1.1"
    assert sorted(tuple(line.split(": ", 1)) for line in lines) == sorted([
        ("Host", f"127.0.0.1:{srv.port}"), ("Content-Length", str(len(body))),
        ("Authorization", "Bearer k"), ("X-Request-Id", "r1")])
    assert (got_body, rest) == (body, b"")  # exactly one request on the connection


INJECTIONS = [[("X-A", "v\r\nX-Evil: 1")], [("X-A", "v\nX-Evil: 1")], [("X-A\r\nX-Evil", "1")]]


def collector(received: list[bytes]) -> Handler:
    """Answer the valid request (its body is b"ok"); keep all that each connection sent."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = b""
        try:
            while chunk := await reader.read(65536):
                data += chunk
                if data.endswith(b"\r\n\r\nok"):
                    writer.write(EMPTY_200)
        finally:  # a reset must not hide what came before it
            received.append(data)
    return handler


async def refused_then_valid(srv: RawServer, pool: Pool, headers: list) -> None:
    with pytest.raises(UpstreamError, match="line break"):
        await pool.request(srv.url(), headers, b"evil")
    # A valid request afterwards: its answer shows the server has accepted any connection
    # the refused one opened (connections are accepted in order).
    resp = await pool.request(srv.url(), [], b"ok")
    resp.release()  # it stays open, idle in the pool


@pytest.mark.parametrize("headers", INJECTIONS)
async def test_header_injection_refused_and_nothing_sent(raw_server, pool, headers):
    received: list[bytes] = []
    srv = await raw_server(collector(received))
    await refused_then_valid(srv, pool, headers)
    await pool.close()
    assert await until(lambda: srv.finished == srv.accepted)
    assert b"Evil" not in b"".join(received)
    assert b"".join(received).count(b"POST ") == 1


async def test_header_injection_leaves_no_connection_open(raw_server, pool):
    srv = await raw_server(collector([]))
    await refused_then_valid(srv, pool, INJECTIONS[0])  # the valid one's connection stays
    assert await until(lambda: srv.accepted - srv.finished == 1, timeout=1.0)


# ---- TLS ----------------------------------------------------------------------------------
async def test_tls_untrusted_certificate_refused(web_server, pool, tmp_path):
    if (openssl := shutil.which("openssl")) is None:
        pytest.skip("the openssl CLI is not installed")
    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True, timeout=30)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    base, transports = await web_server(ok, ssl=server_ctx)
    assert base.scheme == "https"
    # A pool that trusts the certificate completes an HTTPS round trip (so the refusal
    # below is about trust, not a broken server) ...
    trusting = Pool(ssl_context=ssl.create_default_context(cafile=cert))
    try:
        resp = await trusting.request(base, [], b"x")
        assert resp.status == 200 and await resp.read() == b"ok"
        resp.release()
    finally:
        await trusting.close()
    # ... and the default pool (system trust store) refuses the self-signed certificate.
    with pytest.raises(UpstreamError, match="SSLCertVerificationError"):
        await pool.request(base, [], b"x")
    assert len(transports) == 1  # the default pool's request never reached the handler


# ---- Pool.close ----------------------------------------------------------------------------
async def test_pool_close_aborts_active_and_idle_connections(raw_server, pool):
    gone: set[bytes] = set()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head, _ = await read_request(reader)
        path = head.split(b" ")[1]
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhello" if path == b"/active"
                     else b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        try:
            await reader.read()  # returns (or raises) once the client drops the connection
        finally:
            gone.add(path)

    srv = await raw_server(handler)
    active = await pool.request(srv.url("/active"), [], b"x")
    assert await active.readany() == b"hello"
    idle = await pool.request(srv.url("/idle"), [], b"x")  # a second connection: one is busy
    assert await idle.read() == b"ok"
    idle.release()
    assert srv.accepted == 2
    await pool.close()
    assert await until(lambda: gone == {b"/idle", b"/active"})
    with pytest.raises(UpstreamError):
        await active.readany()


async def test_idle_connections_are_closed_after_keepalive(raw_server):
    """A connection left idle in the pool is closed after keepalive_seconds, even when no
    further request comes to reuse (and lazily expire) it."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await reader.read()  # until the client closes

    srv = await raw_server(handler)
    pool = Pool(keepalive_seconds=0.2)
    try:
        resp = await pool.request(srv.url("/"), [], b"x")
        assert await resp.read() == b"ok"
        resp.release()
        assert srv.finished == 0  # kept alive for now
        assert await until(lambda: srv.finished == 1)
    finally:
        await pool.close()
