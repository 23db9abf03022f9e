"""Where one engine step's GPU time goes, kernel by kernel, on CUDA.

Synthetic Llama-2-7B (bf16, every CUDA default), one engine: a 512-token prefill (three
prompts, each alone) and decode steps at batch 1 and 64 (context about 512-560) under
``torch.profiler``; per step, the kernels' summed device time by name and count, the largest
first. Before that, the cuBLAS and cuBLASLt times of the layer's four GEMM shapes at 512 and
64 rows (torch's ``preferred_blas_library``), to see whether the other library would pay.

``--sections mixed``: what a loaded batch-64 server's steps cost, with the engine's default
prefill budget (1,024 tokens a step): a 1,024-token prefill alone (two 512-token prompts), 64
decodes alone (context about 560), and the two together in one step (two new prompts beside 64
running decodes), each timed (wall per step) and profiled; then a closed loop of 64 clients
(distinct 512-token prompts, 64 output tokens) with the steps that carried prefill and the
decode-only ones timed apart.

``python -m benchmarks.step_kernels [--sections gemm,steps,mixed] [--kv-cache-dtype int8]
--json PATH`` (GPU only; the K/V dtype is the mixed section's).
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.profiling.summary import merge
from backend.weights.loader import synthetic_source
from benchmarks.closed_loop import ClosedLoop, seeded_prompts
from benchmarks.quant import graph_time_us

# (rows, out features, in features) of qkv, o, gate_up, down at Llama-2-7B widths
GEMMS = [(m, n, k) for m in (512, 64) for n, k in
         ((12288, 4096), (4096, 4096), (22016, 4096), (4096, 11008))]


def gemm_us(m: int, n: int, k: int) -> float:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    return graph_time_us(partial(F.linear, x, w))


def blas_libraries() -> dict:
    res = {}
    for lib in ("cublas", "cublaslt"):
        torch.backends.cuda.preferred_blas_library(lib)
        for m, n, k in GEMMS:
            us = gemm_us(m, n, k)
            res[f"{lib} {m}x{n}x{k}"] = {"us": us, "tflop_s": 2 * m * n * k / us / 1e6}
            print(f"{lib:8s} {m:4d} x {n:5d} x {k:5d}: {us:7.1f} us "
                  f"{2 * m * n * k / us / 1e6:5.0f} TFLOP/s", flush=True)
    torch.backends.cuda.preferred_blas_library("cublas")
    return res


def by_kernel(prof: profile, steps: int) -> dict:
    """Per step: total kernel time, the time the GPU was busy (the union of the kernels'
    intervals: overlapping kernels counted once), kernel count, and the kernels by summed
    time."""
    spans = [(e.time_range.start, e.time_range.end) for e in prof.events()
             if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(end - start for start, end in merge(spans)) / steps
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", 0)
        if t > 0 and e.device_type == torch.autograd.DeviceType.CUDA:
            rows.append({"us": t / steps, "count": e.count / steps, "name": e.key})
    rows.sort(key=lambda r: -r["us"])
    return {"kernel_us_per_step": sum(r["us"] for r in rows), "busy_us_per_step": busy,
            "kernels_per_step": sum(r["count"] for r in rows), "kernels": rows[:25]}


def _print_kernels(label: str, r: dict) -> None:
    print(f"== {label}: {r['kernel_us_per_step']:.0f} us of kernels per step "
          f"({r['busy_us_per_step']:.0f} us busy), {r['kernels_per_step']:.0f} kernels")
    for k in r["kernels"][:12]:
        print(f"  {k['us']:8.1f} us {k['count']:5.0f}x  {k['name'][:90]}")


def _timed_ms(fn, n: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e3


def _profiled(fn, n: int) -> dict:
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    return by_kernel(prof, n)


def engine_steps() -> dict:
    engine = LLMEngine(EngineConfig(device="cuda", dtype="bfloat16", attention="triton",
                                    enable_prefix_caching=False, kv_cache_memory_gib=24,
                                    max_model_len=1024, max_num_seqs=64),
                       synthetic_source("llama-2-7b"))
    gen = torch.Generator().manual_seed(0)

    def prompt(n: int) -> list[int]:
        return torch.randint(10, 30000, (n,), generator=gen).tolist()

    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    for _ in range(3):
        engine.generate([prompt(512)], one)
    torch.cuda.synchronize()
    res = {"prefill512": _profiled(lambda: engine.generate([prompt(512)], one), 3)}
    for batch in (1, 64):
        params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
        for i in range(batch):
            engine.add_request(f"b{batch}-{i}", prompt(512), params)
        for _ in range(4 if batch == 1 else 24):  # past the prompts' prefill steps
            engine.step()
        torch.cuda.synchronize()
        res[f"decode_b{batch}"] = _profiled(engine.step, 10)
        while engine.has_unfinished():
            engine.step()
    for label, r in res.items():
        _print_kernels(label, r)
    return res


def mixed_steps(kv_cache_dtype: str = "auto", weights_dtype: str = "auto") -> dict:
    source = synthetic_source("llama-2-7b")
    engine = LLMEngine(EngineConfig(device="cuda", dtype="bfloat16", max_num_seqs=128,
                                    kv_cache_memory_gib=40, max_model_len=1024,
                                    enable_prefix_caching=False,
                                    kv_cache_dtype=kv_cache_dtype,
                                    weights_dtype=weights_dtype), source)
    gen = torch.Generator().manual_seed(0)
    ids = itertools.count()

    def prompt() -> list[int]:
        return torch.randint(100, 30000, (512,), generator=gen).tolist()

    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)

    def two_prompts() -> None:  # 1,024 prefill tokens in one step, beside whatever runs
        for _ in range(2):
            engine.add_request(f"p{next(ids)}", prompt(), one)

    def prefill_alone() -> None:
        two_prompts()
        while engine.has_unfinished():
            engine.step()

    def mixed() -> None:
        two_prompts()
        engine.step()

    res: dict = {"prefill_tokens_per_step": engine.config.prefill_budget(),
                 "kv_cache_dtype": kv_cache_dtype, "weights": engine.stats().weights_format}
    for _ in range(3):
        prefill_alone()
    res["prefill1024_ms"] = _timed_ms(prefill_alone, 5)
    res["prefill1024"] = _profiled(prefill_alone, 3)
    running = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
    for i in range(64):
        engine.add_request(f"d{i}", prompt(), running)
    for _ in range(60):  # their prefill, then decodes up to a context of about 544
        engine.step()
    res["decode64_ms"] = _timed_ms(engine.step, 20)
    res["decode64"] = _profiled(engine.step, 10)
    for _ in range(3):
        mixed()
    res["mixed_ms"] = _timed_ms(mixed, 20)
    res["mixed"] = _profiled(mixed, 5)
    for i in range(64):
        engine.abort_request(f"d{i}")
    while engine.has_unfinished():
        engine.step()
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    loop = ClosedLoop(engine, seeded_prompts(source.config.vocab_size, 512, 1), params, 64)
    run = loop.run(64, 320)
    with_prefill = [s.duration_s * 1e3 for s in run.steps if s.prefill_tokens]
    decode_only = [s.duration_s * 1e3 for s in run.steps if not s.prefill_tokens]
    res["closed_loop_64"] = {
        "output_tok_s": run.window_tokens / run.window_s, "steps": len(run.steps),
        "prefill_steps": len(with_prefill), "prefill_step_ms_mean": statistics.fmean(with_prefill),
        "decode_only_steps": len(decode_only),
        "decode_only_step_ms_mean": statistics.fmean(decode_only),
        "prefill_tokens_per_prefill_step_mean": statistics.fmean(
            s.prefill_tokens for s in run.steps if s.prefill_tokens),
        "decodes_per_prefill_step_mean": statistics.fmean(
            s.decode_tokens for s in run.steps if s.prefill_tokens)}
    print(f"prefill 1,024 alone {res['prefill1024_ms']:.2f} ms, 64 decodes alone "
          f"{res['decode64_ms']:.2f} ms, both in one step {res['mixed_ms']:.2f} ms")
    for label in ("prefill1024", "decode64", "mixed"):
        _print_kernels(label, res[label])
    print("closed loop, 64 clients:", res["closed_loop_64"])
    return res


SECTIONS = ("gemm", "steps", "mixed")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default="gemm,steps",
                    help=f"comma-separated, of {', '.join(SECTIONS)}")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "int8", "fp8_e4m3"),
                    help="the mixed section's K/V cache")
    ap.add_argument("--weights-dtype", default="auto",
                    choices=("auto", "bf16", "int8", "int4", "fp8"),
                    help="the mixed section's linear weights (--weights-dtype of the backend)")
    args = ap.parse_args(argv)
    sections = args.sections.split(",")
    if not set(sections) <= set(SECTIONS):
        ap.error(f"--sections takes {', '.join(SECTIONS)}")
    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    if "gemm" in sections:
        res["gemm"] = blas_libraries()
    if "steps" in sections:
        res.update(engine_steps())
    if "mixed" in sections:
        res["mixed"] = mixed_steps(args.kv_cache_dtype, args.weights_dtype)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
