"""One-token matmuls with their prologue fused (``backend.layers.gemv``) against the
unfused steps, on Llama-2-7B's shapes, in one GPU process.

1. Copy bandwidth (the floor's rate).
2. Per layer (qkv, o, gate_up, down, LM head, each with the prologue it has in the model):
   cuBLAS alone, the unfused steps (our Triton norm / SiLU·mul kernel, then cuBLAS), and
   every tile variant of the fused bf16 GEMV. Enough distinct weight copies rotate
   through each CUDA graph that no layer is served from L2 (50 MB). int8: every one-token
   GEMV variant of ``benchmarks.quant_sweep``, after the separate prologue kernel and (the
   word-wise ones) with the prologue fused. The fastest variant per shape is reported
   (``picks``); ``--install`` runs steps 3 and 4 with the picks instead of the committed
   tables (``gemv.CONFIGS``, ``quant_kernels.INT8_FUSED``).
3. The chain: 32 blocks of the synthetic model's real weights, attention left out (its
   input is the block's q), one token, CUDA-graph replays: the fused one-token path
   against the same Triton step ops without it, and the eager ops, for bf16 and int8.
4. ``--engine``: ``benchmarks.quant.engine_level`` (the engine's step time at batch 1 and
   64) per weight format.

    python -m benchmarks.one_token_gemv --json OUT.json [--engine bf16,int8] [--install]
        [--smoke]

``--smoke``: tiny shapes on the CPU under ``TRITON_INTERPRET=1`` (plumbing only).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import time
from functools import partial

import torch
import torch.nn.functional as F

from backend.layers import fused_ops, gemv, quant_kernels
from backend.layers.gemv import ADD_NORM, NONE, SILU_MUL, Prologue
from backend.layers.linear import WeightFormat
from backend.layers.quantize import quantize_int8
from backend.model import LlamaModel
from backend.weights.presets import PRESETS
from benchmarks.quant import copies_past_l2, engine_level, graph_time_us, rel_err, time_rotating
from benchmarks.quant_sweep import copy_gbs
from benchmarks.quant_sweep import variants as quant_variants

SHAPES_7B = (("qkv", 12288, 4096, ADD_NORM), ("o", 4096, 4096, NONE),
             ("gate_up", 22016, 4096, ADD_NORM), ("down", 4096, 11008, SILU_MUL),
             ("lm_head", 32000, 4096, ADD_NORM))
SHAPES_SMOKE = (("a", 48, 256, ADD_NORM), ("b", 40, 128, SILU_MUL))
# bf16 GEMV tiles: (BLOCK_N, BLOCK_K, STAGES, num_warps)
BF16 = ((2, 2048, 3, 4), (4, 1024, 3, 4), (4, 512, 3, 4), (8, 256, 3, 4), (8, 512, 1, 4),
        (8, 512, 3, 4), (8, 512, 4, 4), (8, 1024, 3, 4), (8, 1024, 3, 8), (16, 256, 3, 4),
        (16, 512, 3, 4), (16, 512, 3, 8), (32, 256, 3, 4), (32, 128, 4, 4))
# int8 at one token: every GEMV variant ``benchmarks.quant_sweep`` tries (the word-wise ones
# also with the prologue fused, and again with x read as [words, 4]: XVEC)
_SWEPT = [{k: v for k, v in cfg.items() if k != "kind"}
          for cfg in quant_variants("int8", 1) if cfg["kind"] == "triton" and "MAGIC" in cfg]
INT8 = _SWEPT + [dict(cfg, XVEC=1) for cfg in _SWEPT if cfg.get("WORDS")]
EPS = 1e-5


def bf16_config(v: tuple) -> dict:
    return dict(BLOCK_N=v[0], BLOCK_K=v[1], STAGES=v[2], num_warps=v[3])


def _inputs(kind: int, K: int, device, dtype) -> tuple[torch.Tensor, Prologue]:
    x = torch.randn(1, 2 * K if kind == SILU_MUL else K, device=device, dtype=dtype)
    res = torch.randn(1, K, device=device, dtype=dtype)
    nw = torch.rand(K, device=device, dtype=dtype) + 0.5
    return x, Prologue(kind, res if kind == ADD_NORM else None,
                       nw if kind != NONE and kind != SILU_MUL else None, EPS)


def unfused(x: torch.Tensor, prologue: Prologue, linear) -> torch.Tensor:
    """The separate Triton prologue kernel, then ``linear`` (the path without fusion)."""
    if prologue.kind == SILU_MUL:
        x = fused_ops.silu_mul_triton(x)
    elif prologue.normed:
        x, _ = fused_ops.add_rms_norm_triton(x, prologue.residual, prologue.norm_w, EPS)
    return linear(x)


def cublas_baselines(x: torch.Tensor, pro: Prologue, ws: list[torch.Tensor], device
                     ) -> tuple[dict, torch.Tensor]:
    """({cublas_us: cuBLAS alone, unfused_us: the prologue kernel then cuBLAS}, each over
    the rotating weights ``ws``, and the unfused path's output in fp32: the reference)."""
    xk = x if pro.kind != SILU_MUL else fused_ops.silu_mul_triton(x)
    times = {"cublas_us": time_rotating([partial(F.linear, xk, w) for w in ws], device),
             "unfused_us": time_rotating(
                 [partial(unfused, x, pro, partial(F.linear, weight=w)) for w in ws], device)}
    return times, unfused(x, pro, partial(F.linear, weight=ws[0])).float()


def checked_time(calls: list, ref: torch.Tensor, device) -> float:
    """µs per call of ``calls`` (one per weight copy), once the first call's output (or
    its first element) is within 3 % of ``ref`` (relative to its largest value). Off CUDA
    (smoke runs under the interpreter, where a call takes seconds) the checked call's own
    wall-clock time: one call, not two."""
    t = time.perf_counter()
    y = calls[0]()
    first_us = (time.perf_counter() - t) * 1e6
    err = rel_err(y[0] if isinstance(y, tuple) else y, ref)
    if err > 3e-2:
        raise AssertionError(f"relative error {err:.3g}")
    return time_rotating(calls, device) if device.type == "cuda" else first_us


def _warm(args: tuple) -> list[str]:
    """Compile the variants of a slice of the shapes in a worker (Triton's disk cache)."""
    shapes, smoke = args
    device = torch.device("cpu" if smoke else "cuda")
    dtype = torch.float32 if smoke else torch.bfloat16
    errors = []
    for name, N, K, kind in shapes:
        x, pro = _inputs(kind, K, device, dtype)
        w = torch.randn(N, K, device=device, dtype=dtype)
        q = torch.randint(-127, 127, (N, K), dtype=torch.int8, device=device)
        s = torch.rand(N, device=device, dtype=dtype)
        for v in BF16:
            for p in (pro, Prologue()):
                try:
                    gemv.gemv(x if p.kind else x[:, :K].contiguous(), w, None, p,
                              bf16_config(v))
                except Exception as exc:
                    errors.append(f"bf16 {name} {v}: {exc!r}"[:300])
        for cfg in INT8:
            try:
                quant_kernels.int8_gemv_fused(x, q, s, pro, cfg)
                quant_kernels.int8_matmul(x[:, :K].contiguous(), q, s, cfg)
            except Exception as exc:
                errors.append(f"int8 {name} {cfg}: {exc!r}"[:300])
    if not smoke:
        torch.cuda.synchronize()
    return errors


def precompile(shapes, smoke: bool, workers: int) -> list[str]:
    if smoke:  # the warm-up's plumbing on one shape: the timed pass runs every variant
        return _warm((shapes[:1], smoke))
    chunks = [(shapes[i::workers], smoke) for i in range(min(workers, len(shapes)))]
    with mp.get_context("spawn").Pool(len(chunks)) as pool:
        return [e for errs in pool.map(_warm, chunks) for e in errs]


def layer_level(shapes, device, dtype) -> tuple[list[dict], dict, dict]:
    """(a row per shape, bf16 picks, int8 picks: shapes where fusing won)"""
    rows, picks, picks8 = [], {}, {}
    for name, N, K, kind in shapes:
        n = copies_past_l2(N * K * 2)
        ws = [torch.randn(N, K, device=device, dtype=dtype) * 0.02 for _ in range(n)]
        x, pro = _inputs(kind, K, device, dtype)
        row = {"shape": name, "N": N, "K": K, "prologue": kind, "copies": n,
               "weight_mb": round(N * K * 2 / 1e6, 1)}
        times, ref = cublas_baselines(x, pro, ws, device)
        row.update(times)
        fused = {}
        for v in BF16:
            cfg = bf16_config(v)
            try:
                fused[str(v)] = checked_time(
                    [partial(gemv.gemv, x, w, None, pro, cfg) for w in ws], ref, device)
            except Exception as exc:
                fused[str(v)] = repr(exc)[:200]
        timed = {k: t for k, t in fused.items() if isinstance(t, float)}
        best = min(timed, key=timed.get)
        picks[(N, K)] = bf16_config(next(v for v in BF16 if str(v) == best))
        row.update(fused_us=fused, best=best, best_us=timed[best])
        del ws
        # int8: enough distinct codes to rotate past L2 too (half the bytes of bf16)
        n8 = copies_past_l2(N * K)
        qs = [quantize_int8(torch.randn(N, K, device=device) * 0.02) for _ in range(n8)]
        qs = [(q, s.to(dtype)) for q, s in qs]
        row["int8_copies"] = n8
        row["int8_unfused_us"] = time_rotating([partial(  # the committed one-token path
            unfused, x, pro, partial(quant_kernels.int8_matmul, q=q, scale=s)) for q, s in qs],
            device)
        ref8 = unfused(x, pro, partial(quant_kernels.int8_matmul, q=qs[0][0],
                                       scale=qs[0][1])).float()
        options, times = {}, {"unfused": {}, "fused": {}}
        for i, cfg in enumerate(INT8):
            for way in ("unfused", "fused"):
                calls = [partial(unfused, x, pro, partial(quant_kernels.int8_matmul, q=q,
                                                          scale=s, config=cfg))
                         if way == "unfused" else
                         partial(quant_kernels.int8_gemv_fused, x, q, s, pro, cfg)
                         for q, s in qs]
                try:
                    if calls[0]() is None:
                        continue  # not word-wise, or splits K: no fused form
                    times[way][i] = options[(way, i)] = checked_time(calls, ref8, device)
                except Exception as exc:
                    times[way][i] = repr(exc)[:200]
        row["int8_variants"] = INT8
        row["int8_variant_us"] = times
        way, i = min(options, key=options.get)
        row["int8_pick"], row["int8_pick_us"] = f"{way} {i}", options[(way, i)]
        picks8[(N, K)] = (way, INT8[i])
        rows.append(row)
        del qs
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows, picks, picks8


def chain_level(weights: str, device, dtype, preset: str = "llama-2-7b", tokens: int = 1,
                variants: dict | None = None) -> dict:
    """Time per step of every block's matmuls and prologues (attention left out) and the
    LM head for ``tokens`` tokens, through the model's own code, per step-ops variant
    (default: the fused one-token path, the Triton ops without it, the eager ops)."""
    cfg = PRESETS[preset]
    model = LlamaModel(cfg, device, dtype, max_len=max(64, tokens),
                       weight_format=WeightFormat.parse(weights))
    x0 = torch.randn(tokens, cfg.hidden_size, device=device, dtype=dtype)
    cos, sin = model.cos_table[:tokens], model.sin_table[:tokens]
    rows = torch.arange(tokens, dtype=torch.long, device=device)

    def step(ops):
        x, residual = x0, None
        for layer in model.layers:
            q, _, _, residual = layer.pre_attention(x, residual, cos, sin, ops, rope=False)
            x, residual = layer.post_attention(q.reshape(tokens, -1), residual, ops)
        return model.head(x, residual, rows, ops)

    variants = variants or {
        "fused": fused_ops.TRITON,
        "triton_unfused": dataclasses.replace(fused_ops.TRITON, fuse_one_token=False),
        "eager": fused_ops.EAGER}
    out = {"weights": weights}
    with torch.inference_mode():
        ref = step(fused_ops.EAGER).float()
        ref32 = None
        if weights == "bf16" and device.type == "cuda":
            # the same weights in fp32, eager: how far each bf16 way is from exact
            model.float()
            x0 = x0.float()
            cos, sin = model.cos_table[:tokens], model.sin_table[:tokens]
            ref32 = step(fused_ops.EAGER).float()
            model.to(dtype)
            x0 = x0.to(dtype)
            cos, sin = model.cos_table[:tokens], model.sin_table[:tokens]
        for name, ops in variants.items():
            got = step(ops).float()
            out[f"{name}_logits_rel_err"] = round(rel_err(got, ref), 5)
            if ref32 is not None:
                out[f"{name}_vs_fp32_rel_err"] = round(rel_err(got, ref32), 5)
                out[f"{name}_vs_fp32_top1"] = bool(
                    (got.argmax(-1) == ref32.argmax(-1)).all())
            out[f"{name}_us"] = graph_time_us(partial(step, ops), iters=20) if device.type == "cuda" \
                else None
    return out  # the model goes with this frame (step's closure holds it until then)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--engine", default="", help="weight formats for the engine, e.g. bf16,int8")
    ap.add_argument("--chain", default="bf16,int8")
    ap.add_argument("--workers", type=int, default=5)
    ap.add_argument("--install", action="store_true",
                    help="run the chain and engine with this run's picks, not the committed")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    shapes = SHAPES_SMOKE if args.smoke else SHAPES_7B
    t0 = time.perf_counter()
    result: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                    "torch": torch.__version__}
    result["copy_gbs"] = copy_gbs(device)
    result["compile_errors"] = precompile(shapes, args.smoke, args.workers)
    result["compile_s"] = round(time.perf_counter() - t0, 1)
    rows, picks, picks8 = layer_level(shapes, device, dtype)
    result["layers"] = rows
    result["committed"] = {"bf16": {f"{n}x{k}": c for (n, k), c in gemv.CONFIGS.items()},
                           "int8 fused": {f"{n}x{k}": c for (n, k), c in
                                          quant_kernels.INT8_FUSED.items()},
                           "int8 gemv": quant_kernels.CONFIGS["int8"][1]}
    result["picks"] = {"bf16": {f"{n}x{k}": c for (n, k), c in picks.items()},
                       "int8": {f"{n}x{k}": c for (n, k), c in picks8.items()}}
    if args.install:
        gemv.CONFIGS.update(picks)
        # int8: the shapes whose pick is fused; an unfused pick is reported only (the
        # one-token GEMV has one config for every shape, ``CONFIGS["int8"][1]``)
        quant_kernels.INT8_FUSED.clear()
        quant_kernels.INT8_FUSED.update({key: cfg for key, (way, cfg) in picks8.items()
                                         if way == "fused"})
    if not args.smoke:
        result["chain"] = []
        for w in args.chain.split(","):
            if w:
                result["chain"].append(chain_level(w, device, dtype))
                torch.cuda.empty_cache()
    result["engine"] = [engine_level(w, 32) for w in args.engine.split(",") if w]
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"copy {result['copy_gbs']} GB/s; compile errors {len(result['compile_errors'])}")
    for r in rows:
        print(f"{r['shape']:8s} cublas {r['cublas_us']:7.1f} unfused {r['unfused_us']:7.1f} "
              f"fused best {r['best_us']:7.1f} {r['best']}  int8 unfused "
              f"{r['int8_unfused_us']:7.1f} pick {r['int8_pick']} {r['int8_pick_us']:.1f}")
    for c in result.get("chain", []):
        print(json.dumps(c))
    for e in result["engine"]:
        print(json.dumps(e))


if __name__ == "__main__":
    main()
