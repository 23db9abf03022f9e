"""Steps that stall the engine under a closed loop: eager steps, slow steps, JIT compiles.

    python -m benchmarks.step_stalls --model synthetic:llama-2-7b --device cuda \
        --concurrency 32,128 --prompts distinct,shared --json runs/step-stalls.json

One engine (every default of the device), driven in-process by ``benchmarks.closed_loop`` at
each concurrency, with two kinds of prompts: ``distinct`` (seeded random ids: no two share a
KV block, so every prompt is prefilled in full) and ``shared`` (one prompt sent again and
again: after the first, each is served from the prefix cache but its last partial block,
so a burst of them costs a few tokens each). Per run: the measured window's steps, those a
CUDA graph did not hold (``graphed`` False: run eagerly, the host launching every kernel),
those slower than ``--slow-ms``, the most prefill chunks one step carried, TTFT p50/p99 and
every Triton compile after start-up (its kernel and milliseconds; a compile under load stalls
every request for its duration), and NVML's GPU-Util over the measured window on CUDA.
"""
from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path
from typing import Iterator

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.weights.loader import load_model_source
from benchmarks.closed_loop import ClosedLoop, run_with_gpu_util, seeded_prompts
from loadtests.stats import summarize


class CompileLog:
    """Triton compiles while installed (its runtime hooks), with their wall time."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.reason: str | None = None
        self._t0: float | None = None
        self._saved: tuple | None = None
        try:
            from triton import knobs
        except ImportError as exc:  # CPU-only installs, or a Triton without knobs
            self.reason = f"Triton's compile hooks unavailable ({exc})"
            return
        self._runtime = knobs.runtime
        self._saved = (knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook)
        knobs.runtime.jit_cache_hook = self._before
        knobs.runtime.jit_post_compile_hook = self._after

    def close(self) -> None:
        """Put back the hooks found at start."""
        if self._saved is not None:
            self._runtime.jit_cache_hook, self._runtime.jit_post_compile_hook = self._saved
            self._saved = None

    def _before(self, *args, **kwargs) -> None:  # None: compile as usual
        self._t0 = time.perf_counter()

    def _after(self, *args, **kwargs) -> None:
        ms = (time.perf_counter() - self._t0) * 1e3 if self._t0 is not None else None
        self.events.append({"kernel": str(kwargs.get("repr", "?")).split("[", 1)[0], "ms": ms})


def _prompts(kind: str, vocab: int, length: int, seed: int) -> Iterator[list[int]]:
    stream = seeded_prompts(vocab, length, seed)
    return stream if kind == "distinct" else itertools.repeat(next(stream))


def run_one(engine: LLMEngine, vocab: int, kind: str, concurrency: int,
            a: argparse.Namespace, compiles: CompileLog) -> dict:
    params = SamplingParams(max_tokens=a.output_tokens, ignore_eos=True, temperature=0.0)
    prompts = _prompts(kind, vocab, a.prompt_tokens, a.seed)
    first = len(compiles.events)
    res, util = run_with_gpu_util(ClosedLoop(engine, prompts, params, concurrency),
                                  concurrency, a.requests)
    steps = res.steps
    ttft = summarize(r.ttft_s for r in res.records).scaled(1e3)
    dur = summarize(s.duration_s for s in steps).scaled(1e3)
    eager = [s for s in steps if s.graphed is False]
    slow = [s for s in steps if s.duration_s * 1e3 > a.slow_ms]
    return {
        "prompts": kind, "concurrency": concurrency, "requests": len(res.records),
        "steps": len(steps), "eager_steps": len(eager), "slow_steps": len(slow),
        "max_prefill_seqs_in_a_step": max((s.prefill_seqs for s in steps), default=0),
        "step_ms_p50": dur.p50, "step_ms_p99": dur.p99, "step_ms_max": dur.max,
        "ttft_p50_ms": ttft.p50, "ttft_p99_ms": ttft.p99,
        "output_tok_s": res.window_tokens / res.window_s if res.window_s else None,
        "gpu_util_mean_pct": util.mean_pct,
        "gpu_util_reason": util.reason,
        "compiles": compiles.events[first:],
        "slowest": [{"ms": s.duration_s * 1e3, "prefill_seqs": s.prefill_seqs,
                     "prefill_tokens": s.prefill_tokens, "decodes": s.decode_tokens,
                     "graphed": s.graphed}
                    for s in sorted(slow, key=lambda s: -s.duration_s)[:10]],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="synthetic:tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--concurrency", default="32,128", help="comma-separated")
    p.add_argument("--prompts", default="distinct,shared", help="distinct, shared or both")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--requests", type=int, default=200, help="measured requests per run")
    p.add_argument("--slow-ms", type=float, default=80.0, help="a step slower than this counts")
    p.add_argument("--kv-cache-memory", type=float, default=None, metavar="GiB")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    a.concurrency = [int(c) for c in a.concurrency.split(",")]
    a.prompts = a.prompts.split(",")
    if not set(a.prompts) <= {"distinct", "shared"}:
        p.error("--prompts takes distinct and/or shared")
    return a


def main(argv: list[str] | None = None) -> dict:
    a = parse_args(argv)
    t0 = time.perf_counter()
    source = load_model_source(a.model)
    engine = LLMEngine(EngineConfig(device=a.device, max_num_seqs=max(a.concurrency),
                                    kv_cache_memory_gib=a.kv_cache_memory,
                                    max_model_len=a.max_model_len), source)
    built_s = time.perf_counter() - t0
    compiles = CompileLog()  # after start-up: what the engine compiles under load
    vocab = source.config.vocab_size
    try:
        runs = [run_one(engine, vocab, kind, c, a, compiles)
                for kind in a.prompts for c in a.concurrency]
    finally:
        compiles.close()
    out = {"model": a.model, "device": a.device, "engine_build_s": built_s,
           "max_prefill_seqs": engine.scheduler.max_prefill_seqs,
           "compile_hooks": compiles.reason or "installed", "runs": runs}
    for r in runs:
        print(f"{r['prompts']:>8} x {r['concurrency']:>3}: steps {r['steps']}, eager "
              f"{r['eager_steps']}, slow {r['slow_steps']}, most chunks in a step "
              f"{r['max_prefill_seqs_in_a_step']}, step ms p50/p99/max {r['step_ms_p50']:.1f}/"
              f"{r['step_ms_p99']:.1f}/{r['step_ms_max']:.1f}, TTFT p50/p99 "
              f"{r['ttft_p50_ms']:.1f}/{r['ttft_p99_ms']:.1f} ms, compiles {len(r['compiles'])}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
