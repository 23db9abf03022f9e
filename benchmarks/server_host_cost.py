"""Host CPU time of the backend server per streamed token and per engine step.

The backend app (``create_app`` + ``start_app``, what ``python -m backend`` serves) runs in
this process on a uvloop loop in the main thread; a client process keeps ``--concurrency``
streaming chat requests in flight (closed loop: each worker sends its next request when the
previous one ends; ``ignore_eos`` so every request streams exactly ``--max-tokens`` tokens).
Over the loaded window it measures:

* the event-loop thread's CPU time (``time.thread_time`` in the loop thread) per streamed
  token: output hand-off, detokenisation, stop matching, SSE chunks, socket writes, metrics;
* per engine step, in the engine thread: wall and thread CPU time of ``LLMEngine.step``
  and of the model forward and the sampler inside it; "host" = the step less those two
  (device work on a GPU): scheduling, step inputs, token bookkeeping, stop checks, the
  outputs and their hand-off to the loop.

Beside them, in the same run, the HTTP floor: the loop's CPU per token when a bare aiohttp
handler streams chunks of the same size to the same client, woken once per step by one
timer (``floor_app``): the socket writes and task wake-ups every streamed token costs.

CPU time, not throughput: on a CPU device the forward dominates the wall clock, while on a
GPU it is the host work that has to fit inside a device step. ``--profile`` adds a second,
cProfile'd pass (loop thread and engine steps) and lists the top functions by own time.

    flock /work/bench.lock .venv/bin/python -m benchmarks.server_host_cost \
        --json docs/benchmarks/host/server-host-cost.json
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import aiohttp
import uvloop
from aiohttp import web

from backend.engine.async_engine import OutputChannel
from backend.engine.config import EngineConfig
from backend.server import ServerConfig, create_app
from backend.server.app import start_app
from backend.server.formatting import SSE_DONE, ChunkFormatter, sse_event
from backend.server.generation import Delta, Finish
from backend.server.handlers import STATE
from backend.tokenizer import IncrementalDetokenizer, Tokenizer
from backend.weights.loader import load_model_source
from openai_stream import SSEFramer, has_content, is_done

# The figures of the commit before the host-cost changes, measured with this module on the
# same VM (docs/benchmarks/host/server-host-cost-before.json); printed beside a new run.
BEFORE_JSON = "docs/benchmarks/host/server-host-cost-before.json"


# --- client process ------------------------------------------------------------------------
async def _client_worker(session: aiohttp.ClientSession, url: str, args: argparse.Namespace,
                         worker: int, totals: dict) -> None:
    for i in range(args.requests_per_worker):
        body = {"model": "m", "stream": True, "max_tokens": args.max_tokens,
                "ignore_eos": True, "temperature": 0,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user",
                              "content": f"Worker {worker} request {i}: tell a long story "
                                         "about a river, a mountain and a lantern."}]}
        framer = SSEFramer()
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                totals["errors"] += 1
                await resp.read()
                continue
            async for data in resp.content.iter_any():
                totals["bytes"] += len(data)
                for payload, _ in framer.feed(data):
                    if payload is None:
                        continue
                    totals["events"] += 1
                    if is_done(payload):
                        totals["done"] += 1
                        continue
                    chunk = json.loads(payload)
                    if has_content(chunk.get("choices")):
                        totals["content_chunks"] += 1
                    if chunk.get("usage"):
                        totals["completion_tokens"] += chunk["usage"]["completion_tokens"]


async def _client(args: argparse.Namespace) -> dict:
    print("ready", flush=True)
    sys.stdin.readline()  # "go": the server has started its window
    totals = {"errors": 0, "bytes": 0, "events": 0, "done": 0, "content_chunks": 0,
              "completion_tokens": 0}
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        await asyncio.gather(*(_client_worker(session, f"{args.client}/v1/chat/completions",
                                              args, w, totals)
                               for w in range(args.concurrency)))
    totals["wall_s"] = round(time.perf_counter() - t0, 3)
    return totals


# --- engine-thread meter ---------------------------------------------------------------------
@dataclass
class StepMeter:
    """Times ``LLMEngine.step`` and the model forward inside it (engine thread only)."""

    recording: bool = False
    profiler: cProfile.Profile | None = None
    steps: list[dict] = field(default_factory=list)
    _dev: list[float] = field(default_factory=lambda: [0.0] * 4)

    def install(self, llm: Any) -> None:
        step, model, sampler = llm.step, llm.runner.model, llm.runner.sampler

        def device_work(fn: Callable, slot: int) -> Callable:
            """fn timed into slot (wall, CPU) and left out of the host profile: the
            forward and the sampler are device work on a GPU."""
            def timed(*a: Any, **kw: Any) -> Any:
                prof = self.profiler if self.recording else None
                if prof is not None:
                    prof.disable()
                w0, c0 = time.perf_counter(), time.thread_time()
                try:
                    return fn(*a, **kw)
                finally:
                    self._dev[slot] += time.perf_counter() - w0
                    self._dev[slot + 1] += time.thread_time() - c0
                    if prof is not None:
                        prof.enable()
            return timed

        def timed_step() -> list:
            if not self.recording:
                return step()
            n_running = len(llm.scheduler.running)  # all decoding in a steady step
            self._dev[:] = [0.0] * 4
            prof = self.profiler
            w0, c0 = time.perf_counter(), time.thread_time()
            if prof is not None:
                prof.enable()
            try:
                outputs = step()
            finally:
                if prof is not None:
                    prof.disable()
                wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
            fw, fc, sw, sc = self._dev
            self.steps.append({"running": n_running, "outputs": len(outputs),
                               "tokens": sum(len(o.new_token_ids) for o in outputs),
                               "wall_s": wall, "cpu_s": cpu, "forward_wall_s": fw,
                               "forward_cpu_s": fc, "sample_wall_s": sw, "sample_cpu_s": sc})
            return outputs

        model.forward = device_work(model.forward, 0)
        sampler.sample = device_work(sampler.sample, 2)
        llm.step = timed_step


def _us(x: float) -> float:
    return round(x * 1e6, 1)


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def summarize_steps(steps: list[dict], batch: int) -> dict:
    """Host time (step less forward and sampling) per step and per token; ``steady`` = steps whose
    every running sequence was decoding at full batch."""
    steady = [s for s in steps if s["running"] == batch and s["outputs"] == batch]
    out = {"steps": len(steps), "steady_steps": len(steady)}
    for name, rows in (("all", steps), ("steady", steady)):
        if not rows:
            continue
        host_wall = [s["wall_s"] - s["forward_wall_s"] - s["sample_wall_s"] for s in rows]
        host_cpu = [s["cpu_s"] - s["forward_cpu_s"] - s["sample_cpu_s"] for s in rows]
        tokens = sum(s["tokens"] for s in rows)
        out[name] = {
            "step_wall_ms_median": round(_median([s["wall_s"] for s in rows]) * 1e3, 3),
            "forward_wall_ms_median": round(_median([s["forward_wall_s"] for s in rows]) * 1e3,
                                            3),
            "sample_wall_ms_median": round(_median([s["sample_wall_s"] for s in rows]) * 1e3,
                                           3),
            "host_wall_us_per_step_median": _us(_median(host_wall)),
            "host_cpu_us_per_step_median": _us(_median(host_cpu)),
            "host_cpu_us_per_token": _us(sum(host_cpu) / tokens) if tokens else None,
            "tokens": tokens}
    return out


def _top(prof: cProfile.Profile, n: int, key: str = "tottime_ms") -> list[dict]:
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (file, line, func), (_, ncalls, tottime, cumtime, _) in stats.stats.items():
        rows.append({"function": f"{os.path.relpath(file) if file.startswith('/') else file}"
                                 f":{line}({func})", "calls": ncalls,
                     "tottime_ms": round(tottime * 1e3, 2), "cumtime_ms": round(cumtime * 1e3, 2)})
    rows.sort(key=lambda r: r[key], reverse=True)
    return rows[:n]


# --- server side -------------------------------------------------------------------------
async def _spawn_client(url: str, args: argparse.Namespace,
                        requests_per_worker: int) -> asyncio.subprocess.Process:
    cmd = [sys.executable, "-m", "benchmarks.server_host_cost", "--client", url,
           "--concurrency", str(args.concurrency), "--max-tokens", str(args.max_tokens),
           "--requests-per-worker", str(requests_per_worker)]
    proc = await asyncio.create_subprocess_exec(*cmd, stdin=subprocess.PIPE,
                                                stdout=subprocess.PIPE)
    assert (await proc.stdout.readline()).strip() == b"ready"
    return proc


async def _window(url: str, args: argparse.Namespace, meter: StepMeter,
                  requests_per_worker: int, loop_profiler: cProfile.Profile | None) -> dict:
    """One loaded window: the client's totals, the loop thread's CPU and the engine's steps."""
    proc = await _spawn_client(url, args, requests_per_worker)
    meter.steps = []
    meter.recording = True
    if loop_profiler is not None:
        loop_profiler.enable()
    rusage0, c0, w0 = os.times(), time.thread_time(), time.perf_counter()
    proc.stdin.write(b"go\n")
    out, _ = await proc.communicate()
    loop_cpu, wall = time.thread_time() - c0, time.perf_counter() - w0
    rusage1 = os.times()
    if loop_profiler is not None:
        loop_profiler.disable()
    meter.recording = False
    client = json.loads(out.decode().strip().splitlines()[-1])
    tokens = client["completion_tokens"]
    return {"client": client, "window_wall_s": round(wall, 3),
            "process_cpu_s": round((rusage1.user - rusage0.user) +
                                   (rusage1.system - rusage0.system), 3),
            "loop_cpu_s": round(loop_cpu, 4),
            "loop_cpu_us_per_token": _us(loop_cpu / tokens) if tokens else None,
            "loop_cpu_us_per_chunk": _us(loop_cpu / client["events"]) if client["events"]
            else None,
            "loop_cpu_us_per_step": _us(loop_cpu / len(meter.steps)) if meter.steps else None,
            "engine": summarize_steps(meter.steps, args.concurrency)}


def floor_app(step_s: float) -> web.Application:
    """The HTTP floor: aiohttp streams of SSE chunks like ours, all woken by one timer every
    ``step_s`` (one hand-off per step), with no engine, tokenizer or middleware: what
    streaming a token costs the loop before any of the backend's own work."""
    fmt = ChunkFormatter("chat", "floor", "m", include_usage=True)
    role, delta = sse_event(fmt.start()[0]), fmt.frame(Delta(" lantern"))
    waiters: list[asyncio.Future] = []

    async def ticker() -> None:
        while True:
            await asyncio.sleep(step_s)
            ready = waiters[:]
            waiters.clear()
            for fut in ready:
                if not fut.done():
                    fut.set_result(None)

    async def stream(request: web.Request) -> web.StreamResponse:
        n = (await request.json())["max_tokens"]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        await resp.write(role)
        loop = asyncio.get_running_loop()
        for _ in range(n):
            waiters.append(loop.create_future())
            await waiters[-1]
            await resp.write(delta)
        usage = {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}
        await resp.write(fmt.frame(Finish("length", usage, {})))
        await resp.write(SSE_DONE)
        await resp.write_eof()
        return resp

    async def run_ticker(app: web.Application) -> Any:
        task = asyncio.create_task(ticker())
        yield
        task.cancel()

    app = web.Application()
    app.router.add_post("/v1/chat/completions", stream)
    app.cleanup_ctx.append(run_ticker)
    return app


async def _floor(args: argparse.Namespace) -> list[dict]:
    runner = web.AppRunner(floor_app(args.floor_step_ms / 1e3), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = "http://127.0.0.1:%d" % runner.addresses[0][1]
    try:
        await _window(base, args, StepMeter(), 1, None)
        return [await _window(base, args, StepMeter(), args.requests_per_worker, None)
                for _ in range(args.repeats)]
    finally:
        await runner.cleanup()


async def _serve_and_measure(args: argparse.Namespace) -> dict:
    engine = EngineConfig(max_num_seqs=args.concurrency, max_model_len=1024,
                          kv_cache_memory_gib=0.5)
    config = ServerConfig(model=args.model, served_model_name="m", engine=engine)
    app = create_app(config)
    runner, base = await start_app(app, "127.0.0.1", 0)
    try:
        meter = StepMeter()
        meter.install(app[STATE].engine.engine)
        await _window(base, args, meter, 1, None)  # warm-up: first requests, allocator
        runs = [await _window(base, args, meter, args.requests_per_worker, None)
                for _ in range(args.repeats)]
        result: dict[str, Any] = {"runs": runs, "floor_runs": await _floor(args)}
        if args.profile:
            # thread CPU clocks: a thread waiting for the GIL or a core is not charged
            loop_prof = cProfile.Profile(time.thread_time)
            meter.profiler = cProfile.Profile(time.thread_time)
            await _window(base, args, meter, args.requests_per_worker, loop_prof)
            meter.profiler, prof = None, meter.profiler
            result["profile"] = {
                "loop_top": _top(loop_prof, args.profile_top),
                "loop_top_cumulative": _top(loop_prof, args.profile_top, "cumtime_ms"),
                "engine_step_top": _top(prof, args.profile_top),
                "engine_step_top_cumulative": _top(prof, args.profile_top, "cumtime_ms")}
        return result
    finally:
        await runner.cleanup()


# --- the per-token pieces alone, the way before and now -----------------------------------
class _TwoDecodes:
    """A tokenizer whose detokenizer decodes both windows of every token (no per-token
    cache): the detokenizer as it was before."""

    def __init__(self, tok: Tokenizer) -> None:
        self.decode = tok.decode

    def decode_one(self, token_id: int, skip_special_tokens: bool = True) -> str:
        return self.decode([token_id], skip_special_tokens)


def _cpu_us_per(n: int, fn: Callable[[], None]) -> float:
    c0 = time.thread_time()
    fn()
    return round((time.thread_time() - c0) / n * 1e6, 2)


async def _handoff_us(make: Callable[[], Any], put: str, streams: int, steps: int) -> float:
    """Event-loop CPU per item: once per step an item goes into each of ``streams``
    channels, each read by its own task (the engine-to-request hand-off)."""
    channels = [make() for _ in range(streams)]

    async def reader(ch: Any) -> None:
        for _ in range(steps):
            await ch.get()

    tasks = [asyncio.create_task(reader(ch)) for ch in channels]
    await asyncio.sleep(0)
    c0 = time.thread_time()
    for _ in range(steps):
        for ch in channels:
            getattr(ch, put)(0)
        await asyncio.sleep(0)  # let every reader take its item
    await asyncio.gather(*tasks)
    return round((time.thread_time() - c0) / (streams * steps) * 1e6, 2)


def measure_components(model: str, tokens: int = 4096) -> dict:
    """CPU µs per streamed token of the hand-off, the chunk bytes and the detokenizer, each
    the way it was and the way it is (same inputs)."""
    tok = load_model_source(model).tokenizer
    ids = tok.encode(" ".join(["The river ran past the mountain, and a lantern shone;"] * 400)
                     + " \"quoted\" \u00e9t\u00e9 \u4e2d\u6587")[:tokens]
    texts = [tok.decode([t]) or "x" for t in ids]
    fmt = ChunkFormatter("chat", "0123456789abcdef", model, include_usage=True)
    out: dict[str, dict] = {}

    def detok(tokenizer: Any) -> Callable[[], None]:
        def run() -> None:
            d = IncrementalDetokenizer(tokenizer)
            for t in ids:
                d.push(t)
        return run

    out["detokenize"] = {"before": _cpu_us_per(len(ids), detok(_TwoDecodes(tok))),
                         "now": _cpu_us_per(len(ids), detok(tok))}
    out["chunk_bytes"] = {
        "before": _cpu_us_per(len(texts), lambda: [sse_event(fmt.delta(Delta(t)))
                                                    for t in texts]),
        "now": _cpu_us_per(len(texts), lambda: [fmt.frame(Delta(t)) for t in texts])}
    out["handoff"] = {
        "before": uvloop.run(_handoff_us(asyncio.Queue, "put_nowait", 64, 64)),
        "now": uvloop.run(_handoff_us(OutputChannel, "put", 64, 64))}
    return out


def _headline(runs: list[dict], floor_runs: list[dict]) -> dict:
    """Medians over the repeats of the figures the docs quote."""
    def med(get: Callable[[dict], float | None]) -> float | None:
        xs = [v for v in (get(r) for r in runs) if v is not None]
        return round(statistics.median(xs), 1) if xs else None
    floor = [r["loop_cpu_us_per_token"] for r in floor_runs]
    return {
        "floor_loop_cpu_us_per_token": round(statistics.median(floor), 1) if floor else None,
        "loop_cpu_us_per_token": med(lambda r: r["loop_cpu_us_per_token"]),
        "loop_cpu_us_per_step": med(lambda r: r["loop_cpu_us_per_step"]),
        "engine_host_cpu_us_per_step": med(
            lambda r: r["engine"].get("steady", {}).get("host_cpu_us_per_step_median")),
        "engine_host_wall_us_per_step": med(
            lambda r: r["engine"].get("steady", {}).get("host_wall_us_per_step_median")),
        "engine_host_cpu_us_per_token": med(
            lambda r: r["engine"].get("steady", {}).get("host_cpu_us_per_token")),
        "forward_wall_ms_per_step": med(
            lambda r: r["engine"].get("steady", {}).get("forward_wall_ms_median")),
    }


def _git_head() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _print_table(doc: dict, before: dict | None) -> None:
    now = doc["headline"]
    print(f"{'figure':34} {'before':>10} {'now':>10}")
    for key, value in now.items():
        old = before["headline"].get(key) if before else None
        if key.startswith("floor_"):  # measured in this run, whatever the commit
            old = None
        print(f"{key:34} {old if old is not None else '-':>10} "
              f"{value if value is not None else '-':>10}")
    for name, row in doc.get("components_us_per_token", {}).items():
        print(f"{name + ' (alone, µs/token)':34} {row['before']:>10} {row['now']:>10}")
    for section in ("loop_top", "engine_step_top"):
        rows = doc.get("profile", {}).get(section)
        if rows:
            print(f"\n{section} (cProfile, own time over one window):")
            for r in rows[:12]:
                print(f"  {r['tottime_ms']:9.1f} ms {r['calls']:8d}  {r['function']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.server_host_cost",
                                description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--requests-per-worker", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--floor-step-ms", type=float, default=20.0,
                   help="the HTTP floor's step: how often it wakes every stream")
    p.add_argument("--profile", action="store_true",
                   help="one more window under cProfile: top functions by own time")
    p.add_argument("--profile-top", type=int, default=30)
    p.add_argument("--components", action="store_true",
                   help="also time the per-token pieces alone, before and now")
    p.add_argument("--json", default=None, help="write the raw results here")
    p.add_argument("--before", default=BEFORE_JSON,
                   help="earlier results printed beside this run (default: %(default)s)")
    p.add_argument("--client", default=None, help=argparse.SUPPRESS)  # the load process
    args = p.parse_args(argv)
    if args.client:
        print(json.dumps(uvloop.run(_client(args))), flush=True)
        return 0
    result = uvloop.run(_serve_and_measure(args))
    if args.components:
        result["components_us_per_token"] = measure_components(args.model)
    doc = {"benchmark": "server_host_cost", "commit": _git_head(),
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                       "python": platform.python_version()},
           "settings": {k: getattr(args, k) for k in ("model", "concurrency", "max_tokens",
                                                       "requests_per_worker", "repeats")},
           "headline": _headline(result["runs"], result["floor_runs"]), **result}
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    before = None
    if args.before and os.path.exists(args.before) and args.before != args.json:
        with open(args.before) as f:
            before = json.load(f)
    _print_table(doc, before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
