"""Spillover demo: a "local" backend with a fixed number of batch slots, driven past its TTFT SLO,
and a fake "cloud" upstream, behind the gateway with three routings of one alias:

- ``local-only``: every request to the local backend (what a gateway without routing does);
- ``least_in_flight``: both deployments, fewest in flight first;
- ``spillover``: local while its predicted TTFT meets ``ttft_slo_ms``, the rest to the cloud.

    flock /work/bench.lock .venv/bin/python -m benchmarks.spillover run \\
        --out docs/benchmarks/gateway-operators

The local backend (``local`` sub-command) models a GPU server's scheduler: a request waits for
one of ``--slots`` slots, then its first token comes ``--prefill-ms`` later and one token every
``--itl-ms``; the slot is held until its last token, so past ``--slots`` streams the TTFT grows
with the queue. Each routing gets the same closed-loop load (``--concurrency`` streams, the
load client of ``benchmarks.gateway``); TTFT is client-observed; the local share comes
from the gateway's request log (``deployment``); ``<out>/spillover<tag>.png`` charts TTFT and
where requests went (loadtests/report.py). Everything runs on this machine: a 2-core VM.
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

from aiohttp import web

from benchmarks.gateway import _client, _spawn
from benchmarks.gateway_client import KEY
from loadtests.procs import stop_process
from loadtests.report import chart_routing
from benchmarks.backend_target import machine


# ---- the slotted local backend ----------------------------------------------------------------
def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def local_app(slots: int, prefill_ms: float, itl_ms: float, tokens: int) -> web.Application:
    sem = asyncio.Semaphore(slots)

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)  # headers at once, as vLLM does; the queue is in the TTFT
        base = {"id": "local", "object": "chat.completion.chunk", "model": body["model"]}
        await resp.write(_sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant"},
                                                     "finish_reason": None}]}))
        async with sem:
            await asyncio.sleep(prefill_ms / 1000)
            for i in range(tokens):
                if i:
                    await asyncio.sleep(itl_ms / 1000)
                await resp.write(_sse({**base, "choices": [{"index": 0, "delta": {
                    "content": f"t{i} "}, "finish_reason": None}]}))
        await resp.write(_sse({**base, "choices": [{"index": 0, "delta": {},
                                                     "finish_reason": "stop"}]}))
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(_sse({**base, "choices": [], "usage": {
                "prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1}}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def _serve_local(a: argparse.Namespace) -> None:
    runner = web.AppRunner(local_app(a.slots, a.prefill_ms, a.itl_ms, a.tokens))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(f"listening http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


# ---- the runs ---------------------------------------------------------------------------------
def _gateway_config(local: str, cloud: str, routing: str, slo_ms: float,
                    log_path: Path) -> dict[str, Any]:
    deployments = [{"provider": "local", "model": "local-model"}]
    if routing != "local-only":
        deployments.append({"provider": "cloud", "model": "cloud-model"})
    model: dict[str, Any] = {"deployments": deployments}
    if routing != "local-only":
        model["routing"] = routing
    if routing == "spillover":
        model["ttft_slo_ms"] = slo_ms
    return {"keys": [{"name": "bench", "env": "BENCH_GATEWAY_KEY"}],
            "providers": {"local": {"base_url": local + "/v1", "max_retries": 0},
                          "cloud": {"base_url": cloud + "/v1", "max_retries": 0}},
            "models": {"timed": model}, "request_log": str(log_path)}


def _run_one(a: argparse.Namespace, tmp: Path, local: str, cloud: str,
             routing: str) -> dict[str, Any]:
    log_path = tmp / f"requests-{routing}.jsonl"
    cfg = tmp / f"gateway-{routing}.yaml"
    cfg.write_text(json.dumps(_gateway_config(local, cloud, routing, a.slo_ms, log_path)))
    gw, url = _spawn([sys.executable, "-m", "gateway", "--config", str(cfg), "--port", "0",
                      "--log-level", "WARNING"], {"BENCH_GATEWAY_KEY": KEY})
    try:
        r = _client(url + "/v1/chat/completions", "timed", a.concurrency, a.requests,
                    a.warmup, timeout=600)
    finally:
        stop_process(gw)
    rows = [json.loads(x) for x in log_path.read_text().splitlines()][a.warmup:]
    ok = [x for x in rows if x["status"] == 200]
    local_n = sum(1 for x in ok if (x["deployment"] or "").startswith("local/"))
    reasons: dict[str, int] = {}
    for x in ok:
        reasons[x["route_reason"]] = reasons.get(x["route_reason"], 0) + 1
    p99 = r["ttft"]["p99_ms"]
    out = {"routing": routing, "ttft_ms": r["ttft"], "e2e_ms": r["e2e"], "errors": r["errors"],
           "req_per_s": r["req_per_s"], "wall_s": r["wall_s"],
           "local_share": round(local_n / len(ok), 3) if ok else None,
           "local_req_per_s": round(local_n / r["wall_s"], 2), "route_reasons": reasons,
           "meets_slo_p99": p99 is not None and p99 <= a.slo_ms}
    print(f"[spillover] {routing}: TTFT p50 {r['ttft']['p50_ms']} p99 {p99} ms, local share "
          f"{out['local_share']} ({out['local_req_per_s']} req/s), errors {r['errors']}",
          flush=True)
    return out


def run_main(a: argparse.Namespace) -> None:
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": machine(),
            "command": " ".join(sys.argv), "loadavg_start": os.getloadavg(),
            "local": {"slots": a.slots, "prefill_ms": a.prefill_ms, "itl_ms": a.itl_ms,
                      "tokens": a.tokens},
            "cloud": {"ttft_ms": a.cloud_ttft_ms, "itl_ms": a.itl_ms, "tokens": a.tokens},
            "slo": {"ttft_ms": a.slo_ms, "percentile": 99}, "concurrency": a.concurrency,
            "requests": a.requests, "warmup": a.warmup}
    local, local_url = _spawn([sys.executable, "-m", "benchmarks.spillover", "local",
                               "--slots", str(a.slots), "--prefill-ms", str(a.prefill_ms),
                               "--itl-ms", str(a.itl_ms), "--tokens", str(a.tokens)])
    cloud, cloud_url = _spawn([sys.executable, "-m", "fakeupstream", "--port", "0",
                               "--ttft-ms", str(a.cloud_ttft_ms), "--itl-ms", str(a.itl_ms),
                               "--tokens", str(a.tokens), "--precise-timers"])
    runs = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-spill-") as tmp:
            for routing in a.routings.split(","):
                runs.append(_run_one(a, Path(tmp), local_url, cloud_url, routing))
    finally:
        stop_process(local)
        stop_process(cloud)
    meta["loadavg_end"] = os.getloadavg()
    path = out_dir / f"spillover{a.tag}.json"
    path.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")
    chart = chart_routing(runs, a.slo_ms, str(out_dir / f"spillover{a.tag}.png"))
    print(f"wrote {path}, {chart}")
    print(f"{'routing':<16} {'TTFT p50':>9} {'TTFT p99':>9} {'local share':>12} "
          f"{'meets SLO':>10}")
    for r in runs:
        print(f"{r['routing']:<16} {r['ttft_ms']['p50_ms']:>9} {r['ttft_ms']['p99_ms']:>9} "
              f"{r['local_share']:>12} {str(r['meets_slo_p99']):>10}")


def _local_args(p: argparse.ArgumentParser) -> None:
    """The local backend's shape (both sub-commands take it; --itl-ms, --tokens: the cloud's
    too)."""
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--prefill-ms", type=float, default=40.0)
    p.add_argument("--itl-ms", type=float, default=10.0)
    p.add_argument("--tokens", type=int, default=32)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.spillover", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the three routings")
    r.add_argument("--out", default="docs/benchmarks/gateway-operators")
    r.add_argument("--routings", default="local-only,least_in_flight,spillover")
    r.add_argument("--tag", default="", help="suffix for the JSON and PNG names")
    _local_args(r)
    r.add_argument("--cloud-ttft-ms", type=float, default=120.0)
    r.add_argument("--slo-ms", type=float, default=200.0)
    r.add_argument("--concurrency", type=int, default=24)
    r.add_argument("--requests", type=int, default=1500)
    r.add_argument("--warmup", type=int, default=48)
    _local_args(sub.add_parser("local", help="(internal) the slotted local backend"))
    a = p.parse_args(argv)
    if a.cmd == "run":
        run_main(a)
    else:
        try:
            import uvloop
            uvloop.run(_serve_local(a))
        except ImportError:
            asyncio.run(_serve_local(a))


if __name__ == "__main__":
    main()
