"""The load client of ``benchmarks.gateway`` and the statistics of its raw samples.

It runs in its own process (``python -m benchmarks.gateway client ...``): one uvloop +
aiohttp event loop driving a closed loop of N concurrent streams, printing one JSON line.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
import uuid
from typing import Any

import aiohttp

from loadtests.stats import summarize
from openai_stream import SSEFramer, has_content, is_done

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
def _content(data: bytes) -> dict[str, Any] | None:
    """The parsed event when this event's data is content-bearing, else None."""
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and has_content(obj.get("choices")) else None


class Sample:
    """One stream as the client saw it (perf_counter_ns = CLOCK_MONOTONIC, shared by every
    process here, so the fake upstream's stamps are on the same clock)."""
    __slots__ = ("request_id", "t0", "t_first", "t_end", "fake_recv", "fake_sent")

    def __init__(self) -> None:
        self.request_id = uuid.uuid4().hex  # joins this row with the gateway's request log
        self.t0 = time.perf_counter_ns()
        self.t_first = self.t_end = self.fake_recv = self.fake_sent = 0


async def _one(session: aiohttp.ClientSession, url: str, payload: bytes,
               headers: dict[str, str]) -> tuple[Sample, str | None]:
    s = Sample()
    done = False
    try:
        async with session.post(url, data=payload,
                                headers={**headers, "x-request-id": s.request_id}) as r:
            if r.status != 200:
                await r.read()
                return s, f"http_{r.status}"
            # One read per arrival, framed here: readline() would cost an await per line,
            # and at 100 streams the client's CPU then delays every target alike.
            framer = SSEFramer()
            while data := await r.content.readany():
                for event, _ in framer.feed(data):
                    if event is None:
                        continue
                    if is_done(event):
                        done = True
                    elif not s.t_first and (obj := _content(event)) is not None:
                        s.t_first = time.perf_counter_ns()
                        s.fake_recv = obj.get("fake_recv_ns", 0)
                        s.fake_sent = obj.get("fake_sent_ns", 0)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return s, type(exc).__name__
    s.t_end = time.perf_counter_ns()
    return s, None if done and s.t_first else "incomplete"


def _summaries(samples: list[Sample]) -> dict[str, Any]:
    """TTFT and E2E; with the fake's stamps also the two halves of the TTFT path:
    ``request_path`` = client start -> fake receipt, ``response_path`` = fake's first send ->
    client's first content, and ``fake_wait`` = the fake's own receipt -> first send."""
    out = {"ttft": summary([(s.t_first - s.t0) / 1e9 for s in samples]),
           "e2e": summary([(s.t_end - s.t0) / 1e9 for s in samples])}
    stamped = [s for s in samples if s.fake_recv and s.fake_sent]
    if stamped:
        out["request_path"] = summary([(s.fake_recv - s.t0) / 1e9 for s in stamped])
        out["response_path"] = summary([(s.t_first - s.fake_sent) / 1e9 for s in stamped])
        out["fake_wait"] = summary([(s.fake_sent - s.fake_recv) / 1e9 for s in stamped])
    return out


async def run_client(url: str, model: str, concurrency: int, requests: int, warmup: int,
                     body_extra: dict[str, Any], spread_s: float = 0.0,
                     samples_path: str | None = None) -> dict[str, Any]:
    """Closed loop: ``concurrency`` workers share ``warmup`` + ``requests`` streams."""
    payload = json.dumps({"model": model, "stream": True, "max_tokens": 64,
                          "messages": [{"role": "user", "content": "Say something long."}],
                          **body_extra}).encode()
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=300)
    samples: list[Sample] = []
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
                sample, err = await _one(session, url, payload, headers)
                if idx < warmup:
                    continue
                if err:
                    errors[err] = errors.get(err, 0) + 1
                else:
                    samples.append(sample)

        await asyncio.gather(*(worker(k) for k in range(concurrency)))
        wall = time.perf_counter() - t_start[0]
    if samples_path:
        with open(samples_path, "w") as f:
            for s in samples:
                f.write(json.dumps({k: getattr(s, k) for k in Sample.__slots__}) + "\n")
    return {"concurrency": concurrency, "requests": requests, "wall_s": round(wall, 3),
            "req_per_s": round(len(samples) / wall, 2), "errors": errors,
            **_summaries(samples)}


def client_main(a: argparse.Namespace) -> None:
    import uvloop
    extra = json.loads(a.body_extra)
    out = uvloop.run(run_client(a.url, a.model, a.concurrency, a.requests, a.warmup, extra,
                                a.spread_s, a.samples))
    print(json.dumps(out), flush=True)
