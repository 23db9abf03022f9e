"""A client that goes away cancels the upstream request at once and frees everything."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest

from gateway import state
from tests.gateway.conftest import CLIENT_KEY, Gateway

MSG = [{"role": "user", "content": "hi"}]


async def _wait(cond, timeout: float = 5.0) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            return False
        await asyncio.sleep(0.02)
    return True


async def _in_flight(gw: Gateway) -> str:
    text = await gw.metrics_text()
    return next(line for line in text.splitlines()
                if line.startswith('gateway_in_flight_requests{model="fast"'))


@pytest.mark.parametrize("fake_opts,read_events", [
    ({"fault": "stall_first"}, 1),                  # waiting for the first token
    ({"ttft_ms": 0, "itl_ms": 200, "tokens": 50}, 3),  # mid-stream
])
async def test_disconnect_cancels_upstream(gw: Gateway, fake_opts, read_events):
    body = {"model": "fast", "messages": MSG, "stream": True, "fake": fake_opts}
    async with aiohttp.ClientSession() as s:
        resp = await s.post(gw.url + "/v1/chat/completions", json=body,
                            headers={"Authorization": f"Bearer {CLIENT_KEY}"})
        seen = 0
        async for line in resp.content:
            if line.startswith(b"data:"):
                seen += 1
                if seen >= read_events:
                    break
        assert gw.fake.stats.open_streams == 1
        resp.close()  # drop the connection mid-stream
    assert await _wait(lambda: gw.fake.stats.cancelled_streams == 1), gw.fake.stats
    assert gw.fake.stats.open_streams == 0 and gw.fake.stats.completed_streams == 0
    rows = await gw.wait_rows(1)
    assert rows[0]["status"] == 499 and rows[0]["error"] == "client_disconnected"
    assert (await _in_flight(gw)).endswith(" 0.0")
    dep = gw.app[state.ROUTER].routes["fast"].deployments[0]
    assert dep.in_flight == 0


async def test_disconnect_before_upstream_headers(gw: Gateway):
    """Non-stream: the upstream has not answered at all yet when the client leaves."""
    body = {"model": "fast", "messages": MSG, "fake": {"ttft_ms": 10_000}}
    async with aiohttp.ClientSession() as s:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await s.post(gw.url + "/v1/chat/completions", json=body,
                             headers={"Authorization": f"Bearer {CLIENT_KEY}"})
    rows = await gw.wait_rows(1)
    assert rows and rows[0]["status"] == 499
    assert (await _in_flight(gw)).endswith(" 0.0")
    assert gw.app[state.ROUTER].routes["fast"].deployments[0].in_flight == 0


@pytest.mark.parametrize("where", ["body", "headers"])
async def test_client_gone_before_the_response(gw: Gateway, monkeypatch, caplog, where):
    """A client whose connection ends while the gateway reads its body, or just as the
    stream's headers go out (injected: the exact errors aiohttp raises there), is recorded
    as a disconnect (499), not as an internal error, and frees its upstream stream."""
    import logging

    from aiohttp import web

    caplog.set_level(logging.INFO)
    raised = []

    if where == "body":
        read = web.BaseRequest.read

        async def cut_read(self):  # the gateway's read of the client body comes first
            if self.app is gw.app and not raised:
                raised.append(where)
                raise ConnectionResetError("Connection lost")
            return await read(self)
        monkeypatch.setattr(web.BaseRequest, "read", cut_read)
    else:
        prepare = web.StreamResponse.prepare

        async def closing_prepare(self, request):
            if request.app is gw.app and not raised:
                raised.append(where)
                raise ConnectionResetError("Cannot write to closing transport")
            return await prepare(self, request)
        monkeypatch.setattr(web.StreamResponse, "prepare", closing_prepare)
    body = {"model": "fast", "messages": MSG, "stream": True}
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.url + "/v1/chat/completions", json=body,
                          headers={"Authorization": f"Bearer {CLIENT_KEY}"}) as r:
            await r.read()
    assert raised == [where]
    rows = await gw.wait_rows(1)
    assert rows[0]["status"] == 499 and rows[0]["error"] == "client_disconnected"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert await _wait(lambda: gw.fake.stats.open_streams == 0), gw.fake.stats
    assert gw.app[state.ROUTER].routes["fast"].deployments[0].in_flight == 0
