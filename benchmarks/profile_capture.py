"""What a live capture costs: TTFT under a closed-loop load with and without POST /debug/profile.

Starts ``python -m backend --enable-profiling`` (a random bearer token in its env), keeps
``--concurrency`` streamed completions in flight (seeded token-id prompts, forced output
length), and runs two phases of ``--seconds`` each after a warm-up: phase A without a capture,
phase B with one ``{"steps": N}`` capture fired a quarter into it. Reports TTFT p50/p99 of
phase A, of phase B, and of the requests whose TTFT overlapped the capture (first token after
the capture was requested, request sent before it ended), plus the capture's own report (the
three numbers of the live server under that load).

    python -m benchmarks.profile_capture --model synthetic:llama-2-7b \
        --backend-args "--device cuda --kv-cache-memory 16 --max-num-seqs 32" \
        --concurrency 32 --out runs/profile-capture.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import time
from pathlib import Path

import aiohttp

from benchmarks.backend_cpu import _body, _stream, start_backend
from loadtests.procs import stop_process
from loadtests.stats import summarize

TOKEN_ENV = "BACKEND_PROFILE_TOKEN"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="synthetic:tiny")
    p.add_argument("--backend-args", default="", help="more `python -m backend` flags")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--vocab", type=int, default=32000, help="prompt ids are drawn below this")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds of load before phase A")
    p.add_argument("--seconds", type=float, default=15.0, help="length of each phase")
    p.add_argument("--capture-steps", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


class Load:
    """Closed loop: each worker sends the next request when its last one ends."""

    def __init__(self, session: aiohttp.ClientSession, base: str, a: argparse.Namespace
                 ) -> None:
        self.session, self.url, self.a = session, f"{base}/v1/completions", a
        self.rng = random.Random(a.seed)
        self.records: list[dict] = []  # {"t0", "first", "end"} on perf_counter
        self.errors: list[str] = []
        self.stop_at = 0.0

    async def worker(self) -> None:
        a = self.a
        while time.perf_counter() < self.stop_at:
            prompt = [self.rng.randrange(3, a.vocab) for _ in range(a.prompt_tokens)]
            try:
                r = await _stream(self.session, self.url,
                                  _body(a.model, prompt, a.output_tokens))
            except (aiohttp.ClientError, KeyError, asyncio.TimeoutError) as exc:
                self.errors.append(repr(exc))
                continue
            if r["stamps"]:
                self.records.append({"t0": r["t0"], "first": r["stamps"][0],
                                     "end": r["stamps"][-1]})

    def ttft_ms(self, lo: float, hi: float, during: tuple[float, float] | None = None
                ) -> dict:
        """TTFT summary of requests sent in [lo, hi); ``during``: only those whose TTFT
        interval overlapped that window."""
        xs = []
        for r in self.records:
            if not lo <= r["t0"] < hi:
                continue
            if during and not (r["first"] >= during[0] and r["t0"] <= during[1]):
                continue
            xs.append((r["first"] - r["t0"]) * 1e3)
        return summarize(xs).to_dict()


async def measure(base: str, token: str, a: argparse.Namespace) -> dict:
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        load = Load(session, base, a)
        t_start = time.perf_counter()
        a_start = t_start + a.warmup
        b_start = a_start + a.seconds
        load.stop_at = b_start + a.seconds
        workers = [asyncio.create_task(load.worker()) for _ in range(a.concurrency)]
        await asyncio.sleep(max(0.0, b_start + a.seconds / 4 - time.perf_counter()))
        c0 = time.perf_counter()
        async with session.post(f"{base}/debug/profile", json={"steps": a.capture_steps},
                                headers={"Authorization": f"Bearer {token}"}) as resp:
            status = resp.status
            report = await resp.json()
        c1 = time.perf_counter()
        await asyncio.gather(*workers)
    capture = (c0, c1)
    return {
        "phase_a": load.ttft_ms(a_start, b_start),
        "phase_b": load.ttft_ms(b_start, load.stop_at),
        "overlapping_capture": load.ttft_ms(b_start, load.stop_at, capture),
        "capture_wall_s": c1 - c0, "capture_status": status,
        "errors": load.errors[:10], "error_count": len(load.errors),
        "requests": len(load.records), "report": report,
    }


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    token = secrets.token_urlsafe(24)
    os.environ[TOKEN_ENV] = token  # inherited by the backend child only for this run
    a.backend_args = f"{a.backend_args} --enable-profiling --profile-dir runs/profiles"
    proc, base, cmd = start_backend(a)
    try:
        result = asyncio.run(measure(base, token, a))
    finally:
        stop_process(proc)
    result["settings"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}
    result["command"] = cmd
    pa, over = result["phase_a"], result["overlapping_capture"]
    rise = over["p99"] / pa["p99"] - 1 if pa["p99"] and over["p99"] else None
    result["ttft_p99_rise_during_capture"] = rise
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=1) + "\n")
    rep = result["report"]
    print(f"requests {result['requests']}, errors {result['error_count']}, capture "
          f"{result['capture_wall_s']:.2f} s (HTTP {result['capture_status']})")
    for name in ("phase_a", "phase_b", "overlapping_capture"):
        s = result[name]
        print(f"{name:>20}: TTFT p50 {s['p50'] or 0:8.1f} ms  p99 {s['p99'] or 0:8.1f} ms  "
              f"n={s['count']}")
    print(f"TTFT p99 rise during the capture: "
          f"{'n/a' if rise is None else f'{rise:+.1%}'}")
    print(rep.get("summary", json.dumps(rep)[:2000]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
