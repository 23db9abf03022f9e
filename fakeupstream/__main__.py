"""The fake upstream's command line: ``python -m fakeupstream --port 0 --ttft-ms 100 ...``."""
from __future__ import annotations

import argparse
import asyncio
import sys

from fakeupstream import server
from fakeupstream.plan import FakeConfig
from fakeupstream.server import FakeUpstream


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m fakeupstream", description=server.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = any free port")
    p.add_argument("--ttft-ms", type=float, default=100.0)
    p.add_argument("--itl-ms", type=float, default=10.0)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--model", default="fake-model")
    p.add_argument("--precise-timers", action="store_true",
                   help="exact delays: wait on a timerfd, not the loop's 1 ms timer")
    p.add_argument("--finish-us", type=float, default=300.0,
                   help="precise mode: wake this early for the first content, yield to the "
                        "deadline (covers the OS wake-up latency; 0 = off)")
    p.add_argument("--itl-grid-us", type=float, default=250.0,
                   help="precise mode: later tokens' deadlines round up to this grid so streams "
                        "share wake-ups (never early, at most this late; 0 = exact)")
    p.add_argument("--stamp", action="store_true",
                   help="fake_recv_ns / fake_sent_ns (CLOCK_MONOTONIC) on every content chunk")
    p.add_argument("--stamp-log", default="", metavar="PATH",
                   help="append one JSONL line per stream: request id, receipt, first send")
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                   help="event loop (uvloop falls back to asyncio when not installed)")
    a = p.parse_args(argv)
    cfg = FakeConfig(host=a.host, port=a.port, ttft_ms=a.ttft_ms, itl_ms=a.itl_ms,
                     tokens=a.tokens, model=a.model, record_limit=100,
                     precise_timers=a.precise_timers, finish_us=a.finish_us, stamp=a.stamp,
                     itl_grid_ns=int(a.itl_grid_us * 1000),
                     stamp_log=a.stamp_log)
    try:
        import uvloop
    except ImportError:
        uvloop = None  # type: ignore[assignment]
    if a.loop == "uvloop" and uvloop is not None:
        uvloop.run(_serve(cfg))
    else:
        asyncio.run(_serve(cfg))


async def _serve(cfg: FakeConfig) -> None:
    fake = FakeUpstream(cfg)
    url = await fake.start()
    print(f"listening {url}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await fake.stop()


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(0)
