"""/readyz probes providers that have a health_path (the local backend): a dead backend shows
as down and the gateway keeps serving the rest; it is up again once the backend is back."""
from __future__ import annotations

import aiohttp

from fakeupstream import FakeConfig, FakeUpstream
from loadtests.procs import free_port
from tests.gateway.conftest import Gateway

MSG = [{"role": "user", "content": "hi"}]


async def _ready(gw: Gateway) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s:
        async with s.get(gw.url + "/readyz") as r:
            return r.status, await r.json()


async def test_readyz_reports_a_dead_backend_and_keeps_serving(make_gateway, fake):
    port = free_port()
    backend = FakeUpstream(FakeConfig(port=port, ttft_ms=1, itl_ms=1, tokens=2))
    gw = await make_gateway(providers={
        "fake": {"base_url": fake.base_url + "/v1", "api_key_env": "GW_UP_KEY",
                 "health_path": "/health"},
        "local": {"base_url": f"http://127.0.0.1:{port}/v1", "health_path": "/health",
                  "max_retries": 0}},
        models={"local": {"provider": "local", "model": "m"}})
    status, body = await _ready(gw)  # the local backend is not running yet
    assert status == 200 and body["status"] == "degraded"
    assert body["providers"]["local"]["health"] == "down"
    assert body["providers"]["fake"]["health"] == "up"
    assert "health" not in body["providers"]["nokey"]  # not probed: no health_path
    r = await gw.client().chat.completions.create(model="fast", messages=MSG)
    assert r.choices[0].message.content  # the other provider still serves
    await backend.start()  # the backend comes back (make run restarts it)
    try:
        status, body = await _ready(gw)
        assert (status, body["status"], body["providers"]["local"]["health"]) == (
            200, "ready", "up")
        r = await gw.client().chat.completions.create(model="local", messages=MSG)
        assert r.choices[0].message.content
    finally:
        await backend.stop()
