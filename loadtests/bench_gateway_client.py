"""The load client of ``loadtests.bench_gateway`` and the statistics of its raw samples.

It runs in its own process (``python -m loadtests.bench_gateway client ...``): one uvloop +
aiohttp event loop driving a closed loop of N concurrent streams, printing one JSON line.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from typing import Any

import aiohttp

from loadtests.sse import has_content
from loadtests.stats import summarize

KEY = "bench-key-not-secret"


# ---- statistics -------------------------------------------------------------------------------
def summary(samples: list[float]) -> dict[str, Any]:
    """Seconds -> the bench's millisecond summary, from loadtests.stats (one percentile rule)."""
    s = summarize(samples).scaled(1000)
    return {"n": s.count, "p50_ms": _r(s.p50), "p90_ms": _r(s.p90), "p99_ms": _r(s.p99),
            "max_ms": _r(s.max), "mean_ms": _r(s.mean)}


def _r(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 3)


# ---- load client (runs in its own process) -----------------------------------------------------
def _is_content(line: bytes) -> bool:
    try:
        obj = json.loads(line[5:])
    except ValueError:
        return False
    return any(has_content(c) for c in obj.get("choices") or ())


async def _one(session: aiohttp.ClientSession, url: str, payload: bytes,
               headers: dict[str, str]) -> tuple[float | None, float | None, str | None]:
    t0 = time.perf_counter()
    ttft = None
    done = False
    try:
        async with session.post(url, data=payload, headers=headers) as r:
            if r.status != 200:
                await r.read()
                return None, None, f"http_{r.status}"
            async for line in r.content:
                if line.startswith(b"data:"):
                    if ttft is None and _is_content(line):
                        ttft = time.perf_counter() - t0
                    elif line.startswith(b"data: [DONE]"):
                        done = True
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return None, None, type(exc).__name__
    e2e = time.perf_counter() - t0
    return ttft, e2e, None if done and ttft is not None else "incomplete"


async def run_client(url: str, model: str, concurrency: int, requests: int, warmup: int,
                     body_extra: dict[str, Any], spread_s: float = 0.0) -> dict[str, Any]:
    """Closed loop: ``concurrency`` workers share ``warmup`` + ``requests`` streams."""
    payload = json.dumps({"model": model, "stream": True, "max_tokens": 64,
                          "messages": [{"role": "user", "content": "Say something long."}],
                          **body_extra}).encode()
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=300)
    ttfts: list[float] = []
    e2es: list[float] = []
    errors: dict[str, int] = {}
    total = warmup + requests
    started = [0]
    t_start = [0.0]
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:

        async def worker(k: int) -> None:
            # Stagger the first requests over one stream's length: a closed loop that starts
            # all workers at once sends synchronized bursts no real client population sends.
            await asyncio.sleep(k * spread_s / concurrency)
            while started[0] < total:
                idx = started[0]
                started[0] += 1
                if idx == warmup:
                    t_start[0] = time.perf_counter()
                ttft, e2e, err = await _one(session, url, payload, headers)
                if idx < warmup:
                    continue
                if err:
                    errors[err] = errors.get(err, 0) + 1
                else:
                    ttfts.append(ttft)  # type: ignore[arg-type]
                    e2es.append(e2e)  # type: ignore[arg-type]

        await asyncio.gather(*(worker(k) for k in range(concurrency)))
        wall = time.perf_counter() - t_start[0]
    return {"concurrency": concurrency, "requests": requests, "wall_s": round(wall, 3),
            "req_per_s": round(len(e2es) / wall, 2), "errors": errors,
            "ttft": summary(ttfts), "e2e": summary(e2es)}


def client_main(a: argparse.Namespace) -> None:
    import uvloop
    extra = json.loads(a.body_extra)
    out = uvloop.run(run_client(a.url, a.model, a.concurrency, a.requests, a.warmup, extra,
                                a.spread_s))
    print(json.dumps(out), flush=True)
