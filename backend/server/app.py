"""The aiohttp application: ``create_app(config)``, the engine's lifetime, and serving."""
from __future__ import annotations

import asyncio
import gc
import logging
import signal
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator, Callable

from aiohttp import web

from backend.engine.nvtx import NvtxRanges
from backend.profiling.gpm import GpmCollector, sampler_for_device

from . import handlers
from .config import ServerConfig
from .connections import ConnectionLimits, GuardedAppRunner
from .debug_profile import ProfileEndpoint
from .errors import error_middleware
from .failures import ERROR_COUNTER, failure_middleware
from .metrics import Metrics
from .state import BackendState, request_id

log = logging.getLogger("backend.server")
CONFIG = web.AppKey("backend_config", ServerConfig)

SourceLoader = Callable[[str], object]  # name_or_path -> ModelSource
EngineFactory = Callable[..., object]  # (EngineConfig, ModelSource, step_observer) -> engine


def _default_loader(name_or_path: str) -> object:
    from backend.weights.loader import load_model_source  # torch and friends: import lazily

    return load_model_source(name_or_path)


def _default_engine(config: object, source: object, step_observer: Callable) -> object:
    from backend.engine.async_engine import AsyncEngine

    return AsyncEngine(config, source, step_observer=step_observer)


def _engine_ctx(loader: SourceLoader, factory: EngineFactory):
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        config = app[CONFIG]
        executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="backend-tokenize")
        engine = gpm = None
        try:
            loop = asyncio.get_running_loop()
            # Loading (and on first use converting) weights takes seconds: not on the loop.
            source = await loop.run_in_executor(executor, loader, config.model)
            metrics = Metrics(lambda: engine.stats() if engine is not None else None)
            gpm = sampler_for_device(config.engine.device)  # SM activity beside GPU-Util
            metrics.registry.register(GpmCollector(gpm))
            app[ERROR_COUNTER] = metrics.request_errors
            started = factory(config.engine, source, metrics.observe_step)
            await started.start()
            engine = started
            name = config.served_model_name or source.name
            nvtx = NvtxRanges(config.engine.nvtx, config.engine.nvtx_prefix)
            app[handlers.STATE] = BackendState(config, source, engine, metrics, executor, name,
                                               nvtx)
            log.info("serving %s (max_model_len %d)", name, engine.max_model_len)
            yield
        finally:
            if engine is not None:
                await engine.stop()
            if gpm is not None:
                gpm.stop()
            executor.shutdown(wait=False, cancel_futures=True)
    return ctx


async def _echo_request_id(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["x-request-id"] = request_id(request)


def create_app(config: ServerConfig, *, source_loader: SourceLoader | None = None,
               engine_factory: EngineFactory | None = None) -> web.Application:
    """The backend app; the loader and engine factory are replaceable for tests."""
    profiling = ProfileEndpoint.from_env(config.profile_dir) if config.enable_profiling \
        else None  # raises ValueError without a token: never an open profiling route
    app = web.Application(middlewares=[failure_middleware, error_middleware],
                          client_max_size=64 * 1024 * 1024)
    app[CONFIG] = config
    app.cleanup_ctx.append(_engine_ctx(source_loader or _default_loader,
                                       engine_factory or _default_engine))
    app.on_response_prepare.append(_echo_request_id)
    app.router.add_post("/v1/chat/completions", handlers.chat_completions)
    app.router.add_post("/v1/completions", handlers.completions)
    app.router.add_get("/v1/models", handlers.models)
    app.router.add_post("/tokenize", handlers.tokenize)
    app.router.add_get("/health", handlers.health)
    app.router.add_get("/metrics", handlers.metrics)
    if profiling is not None:
        app.router.add_post("/debug/profile", profiling.handle)
        app.on_startup.append(profiling.warm)  # after the engine context has started
    return app


async def start_app(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Start serving; returns the runner and the base URL (port 0 picks a free port)."""
    # handler_cancellation: a client that hangs up cancels its handler, which aborts the
    # engine request even while it still waits in the queue and nothing is being written.
    config = app[CONFIG]
    limits = ConnectionLimits(config.header_timeout_s, config.keepalive_timeout_s,
                              config.max_connections)
    runner = GuardedAppRunner(app, limits, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound_host, bound_port = runner.addresses[0][:2]
    return runner, f"http://{bound_host}:{bound_port}"


def freeze_startup_objects() -> None:
    """Keep full garbage collections short. torch, Triton and the model leave a few hundred
    thousand objects alive after start-up; every full pass walked them all, holding the GIL
    (so the engine thread and every stream) for 100-130 ms about once a second under a
    busy HTTP load on the 2-core VM. Frozen, they are never scanned again: the same load's
    longest pass is ~5 ms. The thresholds stay at the default: larger ones made each
    young-generation pass tens of milliseconds long."""
    gc.collect()
    gc.freeze()


async def serve(config: ServerConfig) -> None:
    """Serve until SIGTERM/SIGINT, then stop the engine cleanly."""
    runner, url = await start_app(create_app(config), config.host, config.port)
    freeze_startup_objects()
    log.info("backend listening on %s", url)
    print(f"backend ready on {url}", flush=True)  # the bound port, also when --port 0
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        await runner.cleanup()
