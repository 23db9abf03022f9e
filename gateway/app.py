"""``create_app(config)``: the gateway's aiohttp application, its resources and small handlers."""
from __future__ import annotations

import asyncio
import hmac
import logging
import os
import re
import time
import uuid
from typing import Any, AsyncIterator, Mapping

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway import state
from gateway.auth import KeyStore, digest, presented_key
from gateway.config import GatewayConfig
from gateway.errors import GatewayError, Unauthorized, status_error
from gateway.limits import Limiter
from gateway.metrics import Metrics
from gateway.proxy import CHAT, COMPLETIONS, proxy
from gateway.record import RequestLog
from gateway.router import Router
from gateway.server import GatewayRunner, Guard
from gateway.routing import RoutingMetrics
from gateway.transport import Transports

log = logging.getLogger("gateway")
_RID_RE = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


def error_response(err: GatewayError, request_id: str) -> web.Response:
    return web.json_response(err.body(), status=err.status,
                             headers={**err.headers, "x-request-id": request_id})


@web.middleware
async def gateway_middleware(request: web.Request, handler):  # type: ignore[no-untyped-def]
    """Stamp receipt time and request id; turn domain errors into OpenAI-shaped responses."""
    request[state.T0] = time.perf_counter_ns()
    rid = request.headers.get("x-request-id", "")
    if not _RID_RE.fullmatch(rid):
        rid = uuid.uuid4().hex
    request[state.REQUEST_ID] = rid
    try:
        resp = await handler(request)
    except GatewayError as exc:
        return error_response(exc, rid)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(status_error(exc.status, exc.reason), rid)
    except (asyncio.CancelledError, KeyboardInterrupt):
        raise
    except Exception:
        log.exception("unhandled error serving %s (request %s)", request.path, rid)
        return error_response(GatewayError("Internal gateway error."), rid)
    if not resp.prepared:
        resp.headers["x-request-id"] = rid
    return resp


# ---- resources: one cleanup_ctx each ---------------------------------------------------------
async def metrics_ctx(app: web.Application) -> AsyncIterator[None]:
    app[state.METRICS] = Metrics()
    yield


async def pool_ctx(app: web.Application) -> AsyncIterator[None]:
    # Upstream connections (gateway/httpclient.py): no limit, since clients bound concurrency
    # and a limit would queue silently and show up as upstream latency; no cookies, so an
    # upstream's Set-Cookie never rides along on other clients' requests.
    # transport.py picks the client per provider (httpclient.py's, or aiohttp's for proxies).
    pool = Transports(app[state.ROUTER].providers.values(), keepalive_seconds=30)
    app[state.POOL] = pool
    yield
    await pool.close()


async def request_log_ctx(app: web.Application) -> AsyncIterator[None]:
    cfg = app[state.CONFIG]
    writer = RequestLog(cfg.request_log, cfg.request_log_csv)
    writer.start()
    app[state.REQUEST_LOG] = writer
    yield
    await writer.close()


async def limits_ctx(app: web.Application) -> AsyncIterator[None]:
    limiter = Limiter(app[state.CONFIG], app[state.METRICS])
    app[state.LIMITER] = limiter
    yield
    await limiter.close()


async def routing_ctx(app: web.Application) -> AsyncIterator[None]:
    app[state.ROUTER].attach_metrics(RoutingMetrics(app[state.METRICS]))
    yield


async def _mark_shutting_down(app: web.Application) -> None:
    app[state.LIFECYCLE].shutting_down = True


# ---- small handlers ---------------------------------------------------------------------------
async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await proxy(request, CHAT)


async def completions(request: web.Request) -> web.StreamResponse:
    return await proxy(request, COMPLETIONS)


async def list_models(request: web.Request) -> web.Response:
    key = request.app[state.KEYS].check(presented_key(request))
    routes = request.app[state.ROUTER].routes
    data = [{"id": alias, "object": "model", "created": 0,
             "owned_by": route.deployments[0].provider.name}
            for alias, route in routes.items() if key.allows(alias)]
    return web.json_response({"object": "list", "data": data})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Ready unless shutting down. Providers with a ``health_path`` (a local backend) are
    probed: one that is down makes the answer ``degraded`` (still 200: the gateway serves
    every other provider, and the backend's restart brings it back)."""
    if request.app[state.LIFECYCLE].shutting_down:
        return web.json_response({"status": "shutting_down"}, status=503)
    router = request.app[state.ROUTER]
    probed = {name: p for name, p in router.providers.items() if p.config.health_path}
    health: dict[str, str] = {}
    if probed:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as session:
            states = await asyncio.gather(*(_probe(session, p) for p in probed.values()))
        health = dict(zip(probed, states))
    providers = {}
    for name, p in router.providers.items():
        providers[name] = {"api_key": ("missing " + p.missing_env) if p.missing_env
                           else ("set" if p.api_key else "none")}
        if name in health:
            providers[name]["health"] = health[name]
    status = "degraded" if "down" in health.values() else "ready"
    return web.json_response({"status": status, "providers": providers})


async def _probe(session: aiohttp.ClientSession, provider: Any) -> str:
    """``up`` when GET <root><health_path> answers 2xx within the session's 1 s, else ``down``."""
    url = provider.root + provider.config.health_path
    try:
        async with session.get(url) as r:
            return "up" if 200 <= r.status < 300 else "down"
    except (aiohttp.ClientError, OSError, TimeoutError):
        return "down"


async def metrics(request: web.Request) -> web.Response:
    token = request.app[state.METRICS_TOKEN]
    if token:
        presented = presented_key(request) or ""
        if not hmac.compare_digest(digest(presented), token):
            raise Unauthorized("Invalid or missing metrics bearer token.")
    body = generate_latest(request.app[state.METRICS].exposition)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def _metrics_token(config: GatewayConfig, env: Mapping[str, str]) -> bytes:
    """sha256 of the /metrics bearer token; b"" leaves /metrics open."""
    mc = config.metrics
    if mc.bearer_sha256:
        return bytes.fromhex(mc.bearer_sha256)
    if not mc.bearer_env:
        return b""
    if env.get(mc.bearer_env):
        return digest(env[mc.bearer_env])
    # Asked for a token but none is set: fail closed with a digest nobody can match.
    log.warning("metrics.bearer_env %s is not set: /metrics refuses every request",
                mc.bearer_env)
    return digest(os.urandom(32).hex())


def create_app(config: GatewayConfig, env: Mapping[str, str] | None = None) -> web.Application:
    """Build the gateway app; ``env`` (default os.environ) supplies keys named in the config."""
    env = os.environ if env is None else env
    app = web.Application(middlewares=[gateway_middleware],
                          client_max_size=config.limits.max_body_bytes)
    app[state.CONFIG] = config
    app[state.KEYS] = KeyStore.from_config(config.keys, env)
    app[state.ROUTER] = Router(config, env)
    app[state.LIFECYCLE] = state.Lifecycle()
    app[state.METRICS_TOKEN] = _metrics_token(config, env)
    app.cleanup_ctx.extend([metrics_ctx, pool_ctx, request_log_ctx, limits_ctx, routing_ctx])
    app.on_shutdown.append(_mark_shutting_down)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


async def start_server(app: web.Application, host: str = "127.0.0.1", port: int = 0,
                       shutdown_timeout: float | None = None,
                       reuse_port: bool = False) -> tuple[web.AppRunner, str]:
    """Serve ``app`` on host:port (0 = any free port); returns the runner and base URL.
    ``reuse_port``: share the port with the other workers (SO_REUSEPORT, workers.py)."""
    grace = app[state.CONFIG].shutdown_grace_seconds if shutdown_timeout is None \
        else shutdown_timeout
    sc = app[state.CONFIG].server
    # handler_cancellation: a client that disconnects cancels its handler at once, which
    # closes the upstream connection even while we wait for the first token.
    # keepalive_timeout: aiohttp closes a connection idle this long (no request in progress),
    # from its start too, so a socket that never sends a byte is closed as well.
    runner = GatewayRunner(app, guard=Guard(sc.header_timeout_seconds, sc.max_connections),
                           handler_cancellation=True, access_log=None, shutdown_timeout=grace,
                           keepalive_timeout=sc.idle_timeout_seconds)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096, reuse_port=reuse_port or None)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, f"http://{host}:{bound}"
