"""Key limits exactness: N requests from several keys into a gateway with 4 workers sharing a
real Redis (``limits.store``); count what each key got admitted against its ``rpm``.

    flock /work/bench.lock .venv/bin/python -m benchmarks.limits \\
        --out docs/benchmarks/gateway-operators

To finish in seconds, the limit is counted per ``--window-s`` (default 86,400 s, so the whole
run falls in one window; the key prefix of a fresh Redis starts at zero) instead of a minute:
``rpm`` is then "requests per window" and the exact answer is ``min(rpm, requests sent)``.
The same load then runs without a store (each worker counts alone: the peer). Every request
is a short non-stream completion from the fake upstream; the client sends
``--concurrency`` at a time, keys taking turns, each on a new connection now and then so the
kernel spreads them over the workers. Machine: a 2-core VM, shared.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.gateway import _spawn
from loadtests.procs import stop_process
from benchmarks.redis_server import RedisServer
from benchmarks.backend_target import machine


async def _load(url: str, keys: list[str], n: int, concurrency: int) -> dict[str, Any]:
    counts = {k: {} for k in keys}  # key -> status -> count
    next_i = iter(range(n))
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}],
            "fake": {"ttft_ms": 0, "itl_ms": 0, "tokens": 1}}

    async def worker() -> None:
        session = aiohttp.ClientSession()
        try:
            for i in next_i:
                if i % 50 == 0:  # new connections now and then: spread over the workers
                    await session.close()
                    session = aiohttp.ClientSession()
                key = keys[i % len(keys)]
                async with session.post(url + "/v1/chat/completions", json=body,
                                        headers={"Authorization": f"Bearer {key}"}) as r:
                    await r.read()
                    c = counts[key]
                    c[r.status] = c.get(r.status, 0) + 1
        finally:
            await session.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {"wall_s": round(time.perf_counter() - t0, 2), "counts": counts}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.limits", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="docs/benchmarks/gateway-operators")
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--keys", type=int, default=4)
    p.add_argument("--rpm", type=int, default=1000, help="limit per key per window")
    p.add_argument("--window-s", type=float, default=86_400.0)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=64)
    a = p.parse_args(argv)
    keys = [f"sk-bench-limits-{i}" for i in range(a.keys)]
    runs = {}
    with RedisServer() as redis:
        for store in ("redis", "per-worker"):  # the second: the same load without a store
            counts, wall = _run(a, keys, redis.url if store == "redis" else None)
            runs[store] = {"wall_s": wall, "per_key": _per_key(a, keys, counts)}
            for row in runs[store]["per_key"]:
                print(f"[{store}] {row['key']}: sent {row['sent']}, admitted {row['admitted']} "
                      f"(limit {row['expected']}, {row['error_pct']:+}%), 429 "
                      f"{row['refused_429']}, other {row['other']}")
    doc = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "machine": machine(), "command": " ".join(sys.argv),
                    "workers": a.workers, "requests": a.requests, "rpm": a.rpm,
                    "window_s": a.window_s, "concurrency": a.concurrency,
                    "loadavg": os.getloadavg()},
           "runs": runs}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "limits-redis.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out / 'limits-redis.json'}")


def _run(a: argparse.Namespace, keys: list[str],
         store: str | None) -> tuple[dict[str, dict[int, int]], float]:
    """One gateway (``a.workers`` workers) over a fresh fake; returns (counts, wall s)."""
    env = {f"BENCH_LIMIT_KEY_{i}": k for i, k in enumerate(keys)}
    limits: dict[str, Any] = {"window_seconds": a.window_s}
    if store:
        limits["store"] = store
    with tempfile.TemporaryDirectory(prefix="bench-limits-") as tmp:
        fake, up = _spawn([sys.executable, "-m", "fakeupstream", "--port", "0",
                           "--ttft-ms", "0", "--itl-ms", "0", "--tokens", "1"])
        cfg = Path(tmp) / "gateway.yaml"
        cfg.write_text(json.dumps({
            "keys": [{"name": f"key{i}", "env": f"BENCH_LIMIT_KEY_{i}", "rpm": a.rpm}
                     for i in range(a.keys)],
            "providers": {"fake": {"base_url": up + "/v1", "max_retries": 0}},
            "models": {"m": {"provider": "fake", "model": "m"}}, "limits": limits}))
        gw, url = _spawn([sys.executable, "-m", "gateway", "--config", str(cfg), "--port", "0",
                          "--workers", str(a.workers), "--log-level", "ERROR"], env)
        try:
            result = asyncio.run(_load(url, keys, a.requests, a.concurrency))
        finally:
            stop_process(gw)
            stop_process(fake)
    return result["counts"], result["wall_s"]


def _per_key(a: argparse.Namespace, keys: list[str],
             counts: dict[str, dict[int, int]]) -> list[dict[str, Any]]:
    per_key = []
    for i, k in enumerate(keys):
        c = counts[k]
        sent = sum(c.values())
        admitted = c.get(200, 0)
        expected = min(a.rpm, sent)
        per_key.append({"key": f"key{i}", "sent": sent, "admitted": admitted,
                        "refused_429": c.get(429, 0),
                        "other": {str(s): n for s, n in c.items() if s not in (200, 429)},
                        "expected": expected,
                        "error_pct": round(100 * (admitted - expected) / expected, 3)})
    return per_key


if __name__ == "__main__":
    main()
