"""Where an eager decode step's host time goes (the ablation's rows 2-4: no CUDA graphs, no
fused step kernels). One engine per config, B requests decoding together, then:
wall per step, cProfile over steps (host functions), torch.profiler over steps (CPU ops and
GPU kernels per step), and each Triton kernel's host cost per launch. On CUDA then the host
cost of each piece of an eager decode layer at Llama-2-7B's shapes, batch 8 (``pieces_us``),
and the GPU time of one layer's decode attention split as in CUDA graphs against unsplit
(``decode_gpu_us``; ``DECODE_GPU=0`` skips it).

    python docs/benchmarks/step/eager-host/probe.py OUT_DIR [model] [device] [configs]

configs: comma-separated of row1 (batch 1, math attention), row2 (batch 1), row3 (batch 8),
row4 (batch 8, int8 K/V).
"""
from __future__ import annotations

import cProfile
import functools
import io
import json
import os
import pstats
import random
import sys
import time
from pathlib import Path

import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.weights.loader import load_model_source

try:
    from backend.layers import launch
except ImportError:  # a tree before the fast launch (ab.sh's "before")
    launch = None

# batch, KV dtype, attention on CUDA (the CPU runs sdpa for all)
CONFIGS = {"row1": (1, "auto", "math"), "row2": (1, "auto", "triton"),
           "row3": (8, "auto", "triton"), "row4": (8, "int8", "triton")}


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def run(out: Path, model: str, device: str, name: str, source) -> dict:
    batch, kv, attention = CONFIGS[name]
    attention = attention if device.startswith("cuda") else "sdpa"
    cfg = EngineConfig(device=device, attention=attention, cuda_graph=False,
                       scheduling="continuous",
                       max_num_seqs=batch, kv_cache_dtype=kv, compile=False,
                       async_scheduling=False, fused_ops=False, cpu_aot_kernels="off",
                       max_model_len=768, kv_cache_memory_gib=4 if device != "cpu" else None)
    eng = LLMEngine(cfg, source)
    dev = eng.runner.device
    rng = random.Random(0)
    vocab = source.config.vocab_size
    prompt = 512 if dev.type == "cuda" else 32
    for i in range(batch):
        eng.add_request(f"r{i}", [rng.randrange(3, vocab) for _ in range(prompt)],
                        SamplingParams(max_tokens=200, ignore_eos=True))
    for _ in range(batch + 10):  # prefills, then a few decodes
        eng.step()
    sync(dev)
    times = []
    for _ in range(30):
        t = time.perf_counter()
        eng.step()
        sync(dev)
        times.append(time.perf_counter() - t)
    t = time.perf_counter()
    for _ in range(30):
        eng.step()
    sync(dev)
    unsynced = (time.perf_counter() - t) / 30
    times.sort()
    # host functions
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(10):
        eng.step()
    sync(dev)
    pr.disable()
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s)
    st.sort_stats("tottime").print_stats(45)
    st.sort_stats("cumulative").print_stats(60)
    (out / f"cprofile-{name}.txt").write_text(s.getvalue())
    # CPU ops and GPU kernels
    acts = [torch.profiler.ProfilerActivity.CPU]
    if dev.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(5):
            eng.step()
        sync(dev)
    ka = prof.key_averages()
    (out / f"ops-{name}.txt").write_text(
        ka.table(sort_by="self_cpu_time_total", row_limit=50) + "\n\n"
        + ka.table(sort_by="count", row_limit=50))
    kernels = sum(e.count for e in ka if e.device_type == torch.autograd.DeviceType.CUDA) \
        if dev.type == "cuda" else None
    launches = {e.key: e.count / 5 for e in ka
                if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx",
                             "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaMemsetAsync")}
    syncs = None
    if dev.type == "cuda":  # host-device syncs inside one step, with where they came from
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            eng.step()
            torch.cuda.set_sync_debug_mode(0)
        syncs = [f"{w.filename}:{w.lineno} {str(w.message)[:120]}" for w in caught
                 if "debug mode is a prototype" not in str(w.message)]  # the mode's own note
        (out / f"syncs-{name}.txt").write_text("\n".join(syncs) + "\n")
    for i in range(batch):
        eng.abort_request(f"r{i}")
    r = {"config": name, "batch": batch, "kv": kv,
         "syncs_per_step": None if syncs is None else len(syncs),
         "step_ms_p50_synced": times[len(times) // 2] * 1e3,
         "step_ms_unsynced": unsynced * 1e3,
         "gpu_ops_per_step": None if kernels is None else kernels / 5,
         "launch_calls_per_step": launches}
    del eng
    return r


def per_call_us(fn, reps: int, dev: torch.device, warmup: int = 3) -> float:
    """Host time of one call of ``fn`` (no sync inside: launches queue on the stream)."""
    for _ in range(warmup):
        fn()
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    us = (time.perf_counter() - t0) / reps * 1e6
    sync(dev)
    return us


def triton_launch_cost(dev: torch.device) -> dict:
    """Host µs per launch of a small Triton kernel with 12 arguments through the JIT's
    ``kernel[grid](...)`` and through ``launch.fast`` (where this tree has it), against one
    torch op."""
    import triton
    import triton.language as tl

    @triton.jit
    def k12(a, b, c, d, n0, n1, n2, n3, s0, s1, s2, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n0
        tl.store(d + i, tl.load(a + i, mask=m) + tl.load(b + i, mask=m) * s0, mask=m)

    x = [torch.zeros(1024, device=dev) for _ in range(4)]
    args = (*x, 1024, 7, 9, 11, 1.0, 2.0, 3.0)
    k12[(1,)](*args, BLOCK=1024)
    sync(dev)
    calls = [("jit", lambda: k12[(1,)](*args, BLOCK=1024)),
             ("torch_add", lambda: torch.add(x[0], x[1], out=x[3]))]
    if launch is not None and launch.ENABLED:
        k12f = launch.fast(k12)
        calls.append(("fast", lambda: k12f[(1,)](*args, BLOCK=1024)))
    return {label + "_us": per_call_us(fn, 2000, dev, warmup=200) for label, fn in calls}


def pieces_us(device: str, reps: int) -> dict:
    """Host microseconds per call of the eager decode step's pieces at Llama-2-7B's shapes,
    batch 8, bf16 K/V: torch ops, cuBLAS matmuls, and our Triton attention's wrappers."""
    from backend.layers import triton_attention as ta
    from backend.layers.fused_ops import add_rms_norm_eager, rope_eager_, silu_mul_eager

    dt, B, H, hd, bs = torch.bfloat16, 8, 32, 128, 16
    dev = torch.device(device)
    x = torch.randn(B, 4096, device=dev, dtype=dt)
    res = torch.randn(B, 4096, device=dev, dtype=dt)
    w = torch.randn(4096, device=dev, dtype=dt)
    qkv_w = torch.randn(3 * 4096, 4096, device=dev, dtype=dt)
    qkv_wt = qkv_w.t()
    qkv = torch.randn(B, 3 * 4096, device=dev, dtype=dt)
    gate_up = torch.randn(B, 2 * 11008, device=dev, dtype=dt)
    cos = torch.randn(B, hd, device=dev, dtype=dt)
    blocks = 64
    cache = torch.zeros(blocks * bs, 2, H, hd, device=dev, dtype=dt)
    tables = torch.arange(blocks, device=dev, dtype=torch.int32).view(B, blocks // B)
    lens = torch.full((B,), 100, device=dev, dtype=torch.int32)
    slots = torch.arange(B, device=dev) * (blocks // B) * bs + 99
    q = qkv[:, :4096].view(B, H, hd)
    k = qkv[:, 4096:8192].view(B, H, hd)
    v = qkv[:, 8192:].view(B, H, hd)
    out = torch.empty(B, H, hd, device=dev, dtype=dt)
    costs = {
        "torch.add": lambda: x + res,
        "F.rms_norm": lambda: torch.nn.functional.rms_norm(x, (4096,), w, 1e-5),
        "add_rms_norm_eager": lambda: add_rms_norm_eager(x, res, w, 1e-5),
        "F.linear qkv": lambda: torch.nn.functional.linear(x, qkv_w),
        "torch.mm qkv, W.T bound": lambda: torch.mm(x, qkv_wt),
        "rope_eager_": lambda: rope_eager_(qkv[:, :8192].view(B, 2 * H, hd), cos, cos),
        "silu_mul_eager": lambda: silu_mul_eager(gate_up),
        "torch.empty": lambda: torch.empty(B, H, hd, device=dev, dtype=dt),
        "store_kv": lambda: ta.store_kv(k, v, slots, cache, None, "auto", bs),
        "paged_decode splits 2": lambda: ta.paged_decode(q, cache, None, tables, lens, out,
                                                        hd ** -0.5, bs, "auto", 2),
        "paged_decode splits 1": lambda: ta.paged_decode(q, cache, None, tables, lens, out,
                                                        hd ** -0.5, bs, "auto", 1),
    }
    return {name: round(per_call_us(fn, reps, dev), 2) for name, fn in costs.items()}


def decode_gpu_us(device: str) -> list[dict]:
    """GPU microseconds of one layer's decode attention (bf16 K/V, Llama-2-7B's 32 heads),
    split as inside CUDA graphs against unsplit, timed in a CUDA graph (no host in it)."""
    import triton.testing

    from backend.layers import triton_attention as ta

    dt, H, hd, bs, dev = torch.bfloat16, 32, 128, 16, torch.device(device)
    rows = []
    for batch in (1, 8):
        for ctx in (544, 2048):
            per = -(-ctx // bs)
            cache = torch.randn(batch * per * bs, 2, H, hd, device=dev, dtype=dt)
            tables = torch.arange(batch * per, device=dev, dtype=torch.int32).view(batch, per)
            lens = torch.full((batch,), ctx, device=dev, dtype=torch.int32)
            q = torch.randn(batch, H, hd, device=dev, dtype=dt)
            out = torch.empty_like(q)
            for splits in sorted({1, ta.decode_splits(batch, H, None, dev)}):
                fn = functools.partial(ta.paged_decode, q, cache, None, tables, lens, out,
                                       hd ** -0.5, bs, "auto", splits)
                ms = triton.testing.do_bench_cudagraph(fn, rep=50)
                rows.append({"batch": batch, "context": ctx, "splits": splits,
                             "gpu_us": round(ms * 1e3, 2)})
    return rows


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    model = sys.argv[2] if len(sys.argv) > 2 else "synthetic:llama-2-7b"
    device = sys.argv[3] if len(sys.argv) > 3 else "cuda"
    names = (sys.argv[4] if len(sys.argv) > 4 else "row1,row2,row3,row4").split(",")
    source = load_model_source(model)
    rows = []
    for n in names:
        rows.append(run(out, model, device, n, source))
        print(json.dumps(rows[-1]), flush=True)
    res = {"model": model, "device": device, "torch": torch.__version__, "rows": rows,
           "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else None}
    if device.startswith("cuda"):
        import triton
        res["triton"] = triton.__version__
        res["launch"] = triton_launch_cost(torch.device(device))
        res["pieces_us"] = pieces_us(device, 200)
        if launch is not None and launch.ENABLED:  # the same pieces through the JIT's launch
            launch.ENABLED = False
            res["pieces_us_jit_launch"] = pieces_us(device, 200)
            launch.ENABLED = True
        if os.environ.get("DECODE_GPU", "1") == "1":
            res["decode_gpu_us"] = decode_gpu_us(device)
    (out / "probe.json").write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
