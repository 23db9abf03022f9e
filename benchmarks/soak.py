"""Backend soak: mixed chat/completion streams and non-streams with random client aborts at
a fixed concurrency against the real backend on the embedded model, for a given duration.

    python -m benchmarks.soak --duration 1800 --json docs/benchmarks/reliability/soak.json

Reports leaked KV blocks once idle (should be 0), the backend's RSS growth after warm-up,
ERROR lines in its log and requests that failed without being aborted (both should be 0).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field

import aiohttp

from benchmarks.backend_target import MODEL, BackendTarget, machine, write_result

PROMPTS = ["Tell me a story about a lighthouse.", "What is the capital of France?",
           "List three colours.", "Explain paged attention in one sentence.",
           "Write a haiku about rain.", "Count to ten."]


_HUNG_UP = "hung up"


@dataclass
class Tally:
    sent: int = 0
    ok: int = 0
    aborted: int = 0
    failed: int = 0
    failures: list[str] = field(default_factory=list)

    def fail(self, what: str) -> None:
        self.failed += 1
        if len(self.failures) < 20:
            self.failures.append(what[:300])


def _body(rng: random.Random, stream: bool, max_tokens: int) -> tuple[str, dict]:
    prompt = rng.choice(PROMPTS)
    common = {"model": MODEL, "max_tokens": rng.randint(1, max_tokens), "stream": stream,
              "temperature": rng.choice([0, 0.7, 1.0])}
    if rng.random() < 0.5:
        return "/v1/chat/completions", {**common,
                                        "messages": [{"role": "user", "content": prompt}]}
    return "/v1/completions", {**common, "prompt": prompt}


async def _one(session: aiohttp.ClientSession, url: str, rng: random.Random,
               abort_rate: float, max_tokens: int, tally: Tally) -> None:
    stream = rng.random() < 0.7
    path, body = _body(rng, stream, max_tokens)
    abort = rng.random() < abort_rate
    tally.sent += 1
    try:
        if abort:
            # Hang up after a few chunks (stream) or a moment (either): cancelling the
            # request task closes the connection mid-answer.
            problem = await asyncio.wait_for(
                _read(session, url + path, body, rng.randint(0, 4)), rng.uniform(0.0, 1.5))
            if problem == _HUNG_UP:
                tally.aborted += 1
            elif problem:
                tally.fail(problem)
            else:
                tally.ok += 1  # finished before the hang-up
        else:
            problem = await _read(session, url + path, body, None)
            if problem:
                tally.fail(problem)
            else:
                tally.ok += 1
    except asyncio.TimeoutError:
        tally.aborted += 1
    except aiohttp.ClientError as exc:
        tally.fail(f"{type(exc).__name__}: {exc}")


async def _read(session: aiohttp.ClientSession, url: str, body: dict,
                stop_after: int | None) -> str:
    """'' when the answer is complete and well-formed, else what is wrong with it."""
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            return f"HTTP {resp.status}: {(await resp.text())[:200]}"
        if not body["stream"]:
            out = await resp.json()
            return "" if out.get("choices") else f"no choices: {out}"
        chunks, done = 0, False
        async for line in resp.content:
            if line.startswith(b"data: [DONE]"):
                done = True
            elif line.startswith(b"data: "):
                if b'"error"' in line[:20]:
                    return f"error event: {line[:200]!r}"
                chunks += 1
                if stop_after is not None and chunks > stop_after:
                    resp.close()  # hang up mid-stream: the connection is dropped
                    return _HUNG_UP
        return "" if done else "stream ended without [DONE]"


async def run_load(url: str, duration_s: float, concurrency: int, abort_rate: float,
                   seed: int, max_tokens: int = 48) -> Tally:
    """Closed-loop mixed load until duration_s has passed (requests under way finish)."""
    tally, deadline = Tally(), time.monotonic() + duration_s
    timeout = aiohttp.ClientTimeout(total=300)

    async def worker(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        # One session per worker; an aborted request's connection is dropped with it.
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while time.monotonic() < deadline:
                await _one(session, url, rng, abort_rate, max_tokens, tally)

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return tally


async def _sample_rss(target: BackendTarget, samples: list[tuple[float, int]],
                      start: float, every_s: float) -> None:
    while True:
        samples.append((round(time.monotonic() - start, 1), target.rss_bytes()))
        await asyncio.sleep(every_s)


async def _run(target: BackendTarget, args: argparse.Namespace) -> dict:
    samples: list[tuple[float, int]] = []
    start = time.monotonic()
    sampler = asyncio.create_task(_sample_rss(target, samples, start,
                                              max(1.0, args.duration / 100)))
    try:
        tally = await run_load(target.base_url, args.duration, args.concurrency, args.abort_rate,
                            args.seed)
    finally:
        sampler.cancel()
    samples.append((round(time.monotonic() - start, 1), target.rss_bytes()))
    idle = await asyncio.to_thread(target.wait_idle)
    # RSS after warm-up (allocator pools, first compilations) is the baseline.
    warm = [rss for t, rss in samples if t >= args.duration * 0.1] or [samples[-1][1]]
    base, final = warm[0], samples[-1][1]
    errors = target.error_lines()
    return {
        "duration_s": args.duration, "concurrency": args.concurrency,
        "abort_rate": args.abort_rate,
        "requests": {"sent": tally.sent, "completed": tally.ok, "aborted_by_client":
                     tally.aborted, "failed": tally.failed},
        "failure_samples": tally.failures,
        "leaked_kv_blocks": idle.kv_blocks_used, "kv_blocks_total": idle.kv_blocks_total,
        "idle_running": idle.running, "idle_waiting": idle.waiting,
        "rss_mb": {"after_warmup": round(base / 2**20, 1), "final": round(final / 2**20, 1),
                   "peak": round(max(r for _, r in samples) / 2**20, 1)},
        "rss_growth_pct": round((final - base) / base * 100, 2),
        "log_error_lines": len(errors), "log_error_samples": errors[:10],
        "backend_alive": target.alive,
        "machine": machine(),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=1800.0, help="seconds (default 30 min)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--abort-rate", type=float, default=0.25,
                   help="share of requests the client hangs up on mid-answer")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default=None, help="also write the result here")
    p.add_argument("--log", default=None, help="the backend's log (default: a temp file)")
    args = p.parse_args(argv)
    log_path = args.log or os.path.join(tempfile.mkdtemp(prefix="soak-"), "backend.log")
    with BackendTarget(log_path, max_num_seqs=args.concurrency) as target:
        result = asyncio.run(_run(target, args))
    result["backend_log"] = log_path
    write_result(args.json, result)
    r = result["requests"]
    print(f"soak {args.duration:g} s at {args.concurrency} concurrent: {r['sent']} requests, "
          f"{r['completed']} completed, {r['aborted_by_client']} aborted by the client, "
          f"{r['failed']} failed; leaked KV blocks {result['leaked_kv_blocks']}/"
          f"{result['kv_blocks_total']}; RSS {result['rss_mb']['after_warmup']} -> "
          f"{result['rss_mb']['final']} MB ({result['rss_growth_pct']:+.2f}%); "
          f"{result['log_error_lines']} error lines in the backend log")
    return result


if __name__ == "__main__":
    res = main()
    sys.exit(0 if res["leaked_kv_blocks"] == 0 and res["requests"]["failed"] == 0
             and res["log_error_lines"] == 0 else 1)
