"""Typed keys for the gateway's app and request state (no module globals are mutated)."""
from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from gateway.auth import KeyStore
from gateway.config import GatewayConfig
from gateway.limits import Limiter
from gateway.metrics import Metrics
from gateway.record import RequestLog
from gateway.router import Router
from gateway.transport import Transports


@dataclass
class Lifecycle:
    shutting_down: bool = False


CONFIG = web.AppKey("config", GatewayConfig)
KEYS = web.AppKey("keys", KeyStore)
ROUTER = web.AppKey("router", Router)
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
METRICS_TOKEN = web.AppKey("metrics_token", bytes)      # sha256 digest; b"" = open /metrics
METRICS = web.AppKey("metrics", Metrics)                # cleanup_ctx: metrics_ctx
POOL = web.AppKey("upstream_pool", Transports)          # cleanup_ctx: pool_ctx
REQUEST_LOG = web.AppKey("request_log", RequestLog)     # cleanup_ctx: request_log_ctx
LIMITER = web.AppKey("limiter", Limiter)                # cleanup_ctx: limits_ctx

REQUEST_ID = web.RequestKey("request_id", str)
T0 = web.RequestKey("t0_ns", int)                       # perf_counter_ns at receipt
