"""``python -m gateway --config PATH [--host H] [--port P]`` (default 127.0.0.1:8080)."""
from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys

from gateway.app import create_app, start_server
from gateway.config import ConfigError, GatewayConfig, load_config

log = logging.getLogger("gateway")


async def serve(config: GatewayConfig, host: str, port: int) -> None:
    """Run until SIGTERM/SIGINT, then stop accepting and let streams finish (grace period)."""
    runner, url = await start_server(create_app(config), host, port)
    _tune_gc()
    print(f"listening {url}", flush=True)
    log.info("gateway listening on %s with %d model aliases", url, len(config.models))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down: no new connections; waiting up to %.0fs for open requests",
             config.shutdown_grace_seconds)
    await runner.cleanup()


def _tune_gc() -> None:
    """Fewer, cheaper collections: each relayed event allocates a few short-lived objects,
    and with the default threshold (700) gen-0 passes run thousands of times a second and
    land on requests' TTFT. Objects alive after start-up are frozen out of every pass."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


def _raise_fd_limit() -> None:
    """Each open stream holds two sockets (client + upstream): lift the soft fd limit."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):  # not on this platform / not allowed
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gateway",
                                description="firsttoken OpenAI-compatible gateway")
    p.add_argument("--config", required=True,
                   help="gateway YAML (configs/gateway.yaml), or a config.toml / settings.json")
    p.add_argument("--host", default=None, help="listen address (default: listen.host, "
                                                "127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="listen port (default: listen.port, "
                                                          "8080; 0 = any free port)")
    p.add_argument("--log-level", default="INFO")
    a = p.parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(a.config)
    except (ConfigError, OSError) as exc:
        print(f"gateway: bad config {a.config}: {exc}", file=sys.stderr)
        return 2
    _raise_fd_limit()
    host = a.host or config.listen.host
    port = config.listen.port if a.port is None else a.port
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a base dependency off Windows
        asyncio.run(serve(config, host, port))
    else:
        uvloop.run(serve(config, host, port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
