"""``python -m gateway --config PATH [--host H] [--port P] [--workers N]`` (default
127.0.0.1:8080, one process)."""
from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys

from gateway.app import create_app, start_server
from gateway.config import ConfigError, GatewayConfig, load_config
from gateway.workers import Supervisor, worker_count

log = logging.getLogger("gateway")


async def serve(config: GatewayConfig, host: str, port: int, reuse_port: bool = False) -> None:
    """Run until SIGTERM/SIGINT, then stop accepting and let streams finish (grace period)."""
    runner, url = await start_server(create_app(config), host, port, reuse_port=reuse_port)
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
    p.add_argument("--workers", type=worker_count, default=1,
                   help="gateway processes sharing the port (default 1; 'auto' = cores)")
    p.add_argument("--worker-id", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    who = "" if a.worker_id is None else f" [worker {a.worker_id}]"
    logging.basicConfig(level=a.log_level.upper(),
                        format=f"%(asctime)s %(levelname)s %(name)s{who}: %(message)s")
    try:
        config = load_config(a.config)
    except (ConfigError, OSError) as exc:
        print(f"gateway: bad config {a.config}: {exc}", file=sys.stderr)
        return 2
    _raise_fd_limit()
    host = a.host or config.listen.host
    port = config.listen.port if a.port is None else a.port
    if a.workers > 1 and a.worker_id is None:
        if any(k.rpm or k.tpm or k.max_concurrent for k in config.keys) \
                and not config.limits.store:
            log.warning("key limits are counted per worker (%d workers): set limits.store "
                        "to share them", a.workers)
        return Supervisor(["--config", a.config, "--log-level", a.log_level], a.workers,
                          host, port, config.shutdown_grace_seconds).run()
    reuse_port = a.worker_id is not None
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a base dependency off Windows
        asyncio.run(serve(config, host, port, reuse_port))
    else:
        uvloop.run(serve(config, host, port, reuse_port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
