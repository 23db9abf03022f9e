"""Real servers on loopback: the fake upstream, the gateway app, and the openai SDK as client."""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest
from aiohttp import web
from openai import AsyncOpenAI

from gateway import state
from gateway.app import create_app, start_server
from gateway.config import TRANSPORTS, build_config
from gateway.httpclient import Pool
from fakeupstream import FakeConfig, FakeUpstream
from gateway.transport import AiohttpTransport
from tests.gateway.httpservers import Handler, RawServer

CLIENT_KEY = "sk-client-canary-7d1f0c9a"
UPSTREAM_KEY = "sk-upstream-canary-b32e88f1"


@dataclass
class Gateway:
    url: str
    app: web.Application
    fake: FakeUpstream
    log_path: Path
    runner: web.AppRunner
    clients: list[AsyncOpenAI] = field(default_factory=list)  # closed by make_gateway

    def client(self, key: str = CLIENT_KEY, **kw: Any) -> AsyncOpenAI:
        # max_retries=0: the SDK must not hide the gateway's own status codes by retrying.
        self.clients.append(AsyncOpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0,
                                        timeout=kw.pop("timeout", 30), **kw))
        return self.clients[-1]

    def log_rows(self) -> list[dict[str, Any]]:
        self.app[state.REQUEST_LOG].flush()
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines()]

    async def wait_rows(self, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        """The log row is written when the handler ends, which may be just after the client
        saw the last byte."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            rows = self.log_rows()
            if len(rows) >= n or loop.time() > end:
                return rows
            await asyncio.sleep(0.02)

    async def metrics_text(self) -> str:
        from prometheus_client import generate_latest
        return generate_latest(self.app[state.METRICS].registry).decode()


def base_config(upstream: str, log_path: Path, transport: str = "fast",
                **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "keys": [{"name": "tester", "env": "GW_TEST_KEY", "models": ["*"]},
                 {"name": "narrow", "env": "GW_NARROW_KEY", "models": ["fast*"]}],
        "providers": {
            "fake": {"base_url": upstream + "/v1", "api_key_env": "GW_UP_KEY",
                     "max_retries": 2, "passthrough": True, "timeout_seconds": 20,
                     "transport": transport},
            "nokey": {"base_url": upstream, "api_key_env": "GW_UNSET_KEY"},
        },
        "models": {"fast": {"provider": "fake", "model": "fake-fast"},
                   "locked": {"provider": "nokey", "model": "m"}},
        "retry": {"backoff_base_seconds": 0.01, "backoff_max_seconds": 0.05,
                  "retry_after_cap_seconds": 2},
        "request_log": str(log_path),
        "shutdown_grace_seconds": 5,
    }
    for k, v in extra.items():  # providers/models merge, so a test overrides only what it names
        doc[k] = {**doc[k], **v} if k in ("providers", "models") else v
    return doc


ENV = {"GW_TEST_KEY": CLIENT_KEY, "GW_NARROW_KEY": "sk-narrow-key", "GW_UP_KEY": UPSTREAM_KEY}

GatewayFactory = Callable[..., Awaitable[Gateway]]


@pytest.fixture
async def fake():
    async with FakeUpstream(FakeConfig(ttft_ms=40, itl_ms=4, tokens=8)) as f:
        yield f


@pytest.fixture
def transport() -> str:
    """The fake provider's upstream transport (modules that test both override this)."""
    return "fast"


def make_pool(transport: str) -> Pool | AiohttpTransport:
    return Pool() if transport == "fast" else AiohttpTransport()


@pytest.fixture(params=TRANSPORTS)
async def each_pool(request: pytest.FixtureRequest):
    """An upstream client of each transport (transport.py), in turn."""
    p = make_pool(request.param)
    yield p
    await p.close()


@pytest.fixture
async def make_gateway(fake, tmp_path, transport):
    """Build and serve a gateway over ``fake``; keyword arguments override config keys."""
    gateways: list[Gateway] = []

    async def make(**extra: Any) -> Gateway:
        log_path = tmp_path / f"requests-{len(gateways)}.jsonl"
        cfg = build_config(base_config(fake.base_url, log_path, transport, **extra), env={})
        app = create_app(cfg, env=ENV)
        runner, url = await start_server(app)
        gateways.append(Gateway(url, app, fake, log_path, runner))
        return gateways[-1]

    yield make
    for g in gateways:
        # SDK clients closed on this loop: left to the garbage collector, they close on a
        # dead one and asyncio logs that into whichever test runs then
        for client in g.clients:
            await client.close()
        await g.runner.cleanup()


@pytest.fixture
async def gw(make_gateway) -> Gateway:
    return await make_gateway()


# ---- servers for tests/gateway/test_httpclient*.py -------------------------------------------
@pytest.fixture
async def raw_server():
    servers: list[RawServer] = []

    async def start(handler: Handler) -> RawServer:
        servers.append(srv := RawServer(handler))
        return await srv.start()

    yield start
    for srv in servers:
        srv.server.close()
        for w in srv.writers:  # handlers still waiting on a connection
            w.close()


@pytest.fixture
async def web_server(aiohttp_server):
    """An aiohttp app with one catch-all POST route; returns (base URL, transports seen): one
    transport per TCP connection, compared by identity (kept alive, so never confused)."""
    async def start(handler, **kw):
        transports: list[object] = []

        async def route(request: web.Request) -> web.StreamResponse:
            if request.transport not in transports:
                transports.append(request.transport)
            return await handler(request)

        app = web.Application()
        app.router.add_post("/{tail:.*}", route)
        return (await aiohttp_server(app, **kw)).make_url("/"), transports

    return start


@pytest.fixture
async def pool():
    p = Pool()
    yield p
    await p.close()
