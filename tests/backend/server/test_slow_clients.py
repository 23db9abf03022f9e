"""Slow clients can't starve the backend: 1,000 idle sockets while /health and a real stream
answer, idle and half-sent requests closed after their timeouts, a clear 503 past the
connection cap."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from backend.engine.config import EngineConfig
from backend.server import ServerConfig, create_app
from benchmarks.idle_sockets import run as hold_idle_sockets

from .conftest import _tiny_source
from .fakes import fake_factory
from .harness import ServerThread


@pytest.fixture(scope="module")
def guarded(smollm2_source):
    """The real engine on SmolLM2 with short slow-client timeouts."""
    config = ServerConfig(model="smollm2-135m-instruct", header_timeout_s=2.0,
                          keepalive_timeout_s=2.0, body_timeout_s=2.0, max_connections=1100,
                          engine=EngineConfig(kv_cache_memory_gib=0.1, max_model_len=512))
    server = ServerThread(lambda: create_app(config, source_loader=lambda _: smollm2_source))
    server.start()
    yield server
    server.stop()


async def test_thousand_idle_sockets_leave_health_and_streams_answering(guarded):
    result = await hold_idle_sockets(guarded.base_url, 1000, 2.0, "smollm2-135m-instruct")
    assert result["stream_completed"] and "Paris" in result["stream_text"]
    assert result["health_requests"] == 20
    assert result["idle_closed_by_server"] == 1000


async def _raw(url: str, data: bytes, wait_s: float) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    try:
        return await asyncio.wait_for(reader.read(), wait_s)
    finally:
        writer.close()


async def test_half_sent_head_is_closed_after_the_header_timeout(guarded):
    answer = await _raw(guarded.base_url, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", 15)
    assert answer == b""  # closed, no request was read


async def test_half_sent_body_gets_a_408(guarded):
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" \
        b"Content-Length: 100\r\n\r\n"
    answer = await _raw(guarded.base_url, head + b'{"model": ', 15)
    status, _, rest = answer.partition(b"\r\n")
    assert b" 408 " in status, answer[:200]
    assert json.loads(rest.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "body_timeout"


async def test_idle_keepalive_connection_is_closed(guarded):
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    host, port = guarded.base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 15)
    assert b" 200 " in head.split(b"\r\n")[0]
    length = int([h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")][0]
                 .split(b":")[1])
    await reader.readexactly(length)
    assert await asyncio.wait_for(reader.read(), 15) == b""  # closed while idle
    writer.close()


async def test_connections_past_the_cap_get_a_503():
    config = ServerConfig(model="synthetic:tiny", served_model_name="fake-model",
                          max_connections=4, engine=EngineConfig(max_num_seqs=8))
    server = ServerThread(lambda: create_app(config, source_loader=lambda _: _tiny_source(),
                                             engine_factory=fake_factory())).start()
    try:
        host, port = server.base_url.removeprefix("http://").split(":")
        held = [await asyncio.open_connection(host, int(port)) for _ in range(4)]
        await asyncio.sleep(0.2)
        answer = await _raw(server.base_url, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 15)
        assert answer.startswith(b"HTTP/1.1 503 ")
        error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
        assert error["code"] == "too_many_connections" and error["type"] == "server_error"
        for _, w in held:
            w.close()
        await asyncio.sleep(0.3)
        async with aiohttp.ClientSession() as session:  # slots free again
            async with session.get(f"{server.base_url}/health") as resp:
                assert resp.status == 200
    finally:
        server.stop()
