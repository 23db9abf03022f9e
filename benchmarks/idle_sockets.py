"""Slow clients against the backend: hold N idle sockets (connected, sending nothing) and
check that /health and a real stream still answer, then that the server closes the idle
sockets once its header timeout passes.

    python -m benchmarks.idle_sockets --sockets 1000 \
        --json docs/benchmarks/reliability/idle_sockets.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from urllib.parse import urlsplit

import aiohttp

from benchmarks.backend_target import DEFAULT_ARGS, MODEL, BackendTarget, machine, write_result


def raise_fd_limit(needed: int) -> None:
    """Lift this process's soft descriptor limit toward the hard one for `needed` sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed + 256
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE,
                           (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))


async def open_idle(url: str, n: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    parts = urlsplit(url)
    socks = []
    for _ in range(n):
        socks.append(await asyncio.open_connection(parts.hostname, parts.port))
    return socks


async def count_closed(socks: list, wait_s: float) -> int:
    """How many of the idle sockets the server has closed (EOF) within wait_s."""
    async def closed(reader: asyncio.StreamReader) -> bool:
        try:
            return await asyncio.wait_for(reader.read(1), wait_s) == b""
        except (asyncio.TimeoutError, ConnectionError):
            return False
    results = await asyncio.gather(*(closed(r) for r, _ in socks))
    for _, w in socks:
        w.close()
    return sum(results)


async def health_latencies(session: aiohttp.ClientSession, url: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        async with session.get(f"{url}/health") as resp:
            assert resp.status == 200
            await resp.read()
        out.append(time.perf_counter() - t0)
    return out


async def stream_text(session: aiohttp.ClientSession, url: str, model: str,
                      max_tokens: int = 8) -> tuple[str, bool]:
    """(text, ended with [DONE]) of one streamed completion."""
    body = {"model": model, "prompt": "The capital of France is", "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    text, done = [], False
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if line.startswith(b"data: [DONE]"):
                done = True
            elif line.startswith(b"data: "):
                text.append(json.loads(line[6:])["choices"][0]["text"])
    return "".join(text), done


async def run(url: str, sockets: int, header_timeout_s: float, model: str) -> dict:
    raise_fd_limit(sockets)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        base = await health_latencies(session, url, 20)  # the floor: no idle sockets yet
    socks = await open_idle(url, sockets)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        lat = await health_latencies(session, url, 20)
        t0 = time.perf_counter()
        text, done = await stream_text(session, url, model)
        stream_s = time.perf_counter() - t0
    closed = await count_closed(socks, header_timeout_s + 10)
    return {"idle_sockets": sockets, "health_requests": len(lat),
            "health_ms": {"p50": round(statistics.median(lat) * 1e3, 2),
                          "max": round(max(lat) * 1e3, 2)},
            "health_ms_without_idle_sockets": {"p50": round(statistics.median(base) * 1e3, 2),
                                               "max": round(max(base) * 1e3, 2)},
            "stream_completed": done, "stream_text": text, "stream_s": round(stream_s, 3),
            "idle_closed_by_server": closed, "header_timeout_s": header_timeout_s}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.idle_sockets", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sockets", type=int, default=1000)
    p.add_argument("--header-timeout", type=float, default=5.0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    log_path = os.path.join(tempfile.mkdtemp(prefix="idle-"), "backend.log")
    extra = (*DEFAULT_ARGS, "--header-timeout", str(args.header_timeout))
    with BackendTarget(log_path, extra=extra) as target:
        result = asyncio.run(run(target.base_url, args.sockets, args.header_timeout, MODEL))
        result["backend_alive"] = target.alive
        result["log_error_lines"] = len(target.error_lines())
    result["machine"] = machine()
    write_result(args.json, result)
    floor = result["health_ms_without_idle_sockets"]
    print(f"{args.sockets} idle sockets: /health p50 {result['health_ms']['p50']} ms, max "
          f"{result['health_ms']['max']} ms (without them: p50 {floor['p50']} ms, max "
          f"{floor['max']} ms); stream completed: {result['stream_completed']} "
          f"in {result['stream_s']} s; {result['idle_closed_by_server']}/{args.sockets} idle "
          f"sockets closed by the server after its {args.header_timeout:g} s header timeout")
    return result


if __name__ == "__main__":
    res = main()
    sys.exit(0 if res["stream_completed"] and res["idle_closed_by_server"] == res["idle_sockets"]
             else 1)
