"""Few-token matmuls (``backend.layers.skinny_gemm``) against cuBLAS on Llama-2-7B's shapes
at the token counts of decode steps, and programmatic dependent launch (``pdl``) in the
engine, in one GPU process.

1. Copy bandwidth (the floor's rate).
2. Per token count and layer (qkv, o, gate_up, down, LM head, each after the prologue
   kernel it has in the model: add + RMSNorm, SiLU·mul or none): cuBLAS alone, the
   prologue kernel + cuBLAS, and the prologue kernel + every tile variant of the Triton
   kernel, weights rotated past L2 in CUDA graphs. The fastest variant per (BLOCK_M, N, K)
   is reported (``picks``), next to the committed tile; ``--install`` runs steps 3 and 4
   with the picks.
3. The chain at ``--chain-rows`` tokens: 32 blocks of the synthetic model's real weights,
   attention left out, through the model's code, with and without ``few_token_matmul``.
4. ``--engine bf16[,int8]``: ``benchmarks.quant.engine_level`` (step time at batch 1, 8, 16,
   32, 64; short context) with PDL off, then on, then on with ``few_token_matmul``.

    python -m benchmarks.skinny_gemm --json OUT.json [--rows 16,32,64,128] [--install]
        [--chain-rows 16,64] [--engine bf16,int8] [--smoke]

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

from backend import model as model_module
from backend.layers import fused_ops, pdl, skinny_gemm
from backend.layers import quant_kernels as qk
from backend.layers.gemv import ADD_NORM, SILU_MUL, Prologue
from backend.layers.quantize import dequantize_int8, quantize_int8
from benchmarks.one_token_gemv import (SHAPES_7B, chain_level, checked_time, cublas_baselines,
                                       unfused)
from benchmarks.quant import copies_past_l2, engine_level
from benchmarks.quant_sweep import copy_gbs

SHAPES_SMOKE = (("a", 48, 256, ADD_NORM), ("b", 40, 128, SILU_MUL))
# (BLOCK_N, BLOCK_K, STAGES, SWAP, num_warps[, TMA]), each with K split 1, 2 and 4 ways
VARIANTS = ((32, 128, 4, 0, 4), (32, 256, 3, 0, 4), (64, 64, 4, 0, 4), (64, 128, 4, 0, 4),
            (64, 64, 5, 1, 4), (64, 128, 3, 1, 4), (64, 128, 4, 1, 4), (64, 256, 3, 1, 4),
            (64, 128, 3, 1, 8), (128, 64, 4, 1, 4), (128, 64, 5, 1, 8), (128, 128, 3, 1, 8),
            (128, 128, 4, 1, 4), (128, 128, 3, 0, 8), (256, 64, 3, 1, 8), (128, 64, 4, 0, 4),
            (128, 64, 5, 0, 8), (256, 64, 4, 0, 8), (256, 128, 3, 0, 8), (64, 64, 6, 0, 4),
            (128, 128, 4, 1, 4, 1), (128, 64, 4, 1, 4, 1), (128, 64, 4, 0, 4, 1),
            (128, 64, 6, 1, 8, 1), (128, 128, 4, 0, 4, 1), (64, 128, 4, 1, 4, 1),
            (64, 64, 6, 0, 4, 1), (32, 256, 4, 0, 4, 1), (32, 128, 6, 0, 4, 1))
SPLITS = (1, 2, 4)
EPS = 1e-5
ENGINE_BATCHES = (1, 8, 16, 32, 64)


def configs() -> list[dict]:
    return [dict(BLOCK_N=v[0], BLOCK_K=v[1], STAGES=v[2], SPLIT=s, SWAP=v[3], num_warps=v[4],
                 **({"TMA": 1} if v[5:] == (1,) else {}))
            for v in VARIANTS for s in SPLITS]


def _inputs(kind: int, M: int, K: int, device, dtype) -> tuple[torch.Tensor, Prologue]:
    x = torch.randn(M, 2 * K if kind == SILU_MUL else K, device=device, dtype=dtype)
    res = torch.randn(M, K, device=device, dtype=dtype)
    nw = torch.rand(K, device=device, dtype=dtype) + 0.5
    return x, Prologue(kind, res if kind == ADD_NORM else None,
                       nw if kind == ADD_NORM else None, EPS)


def _warm(args: tuple) -> list[str]:
    """Compile one shape's variants at one token count in a worker (Triton's disk cache
    keeps them for the timing process)."""
    (name, N, K, _), M, smoke, weights = args
    device = torch.device("cpu" if smoke else "cuda")
    x = torch.randn(M, K, device=device, dtype=torch.bfloat16)
    w, s = _weight(N, K, device, torch.bfloat16, weights)
    errors = []
    for cfg in configs():
        try:
            _skinny(x, (w, s), cfg)
        except Exception as exc:
            errors.append(f"{M} {name} {cfg}: {exc!r}"[:300])
    if not smoke:
        torch.cuda.synchronize()
    return errors


def precompile(shapes, rows, smoke: bool, workers: int, weights: str = "bf16") -> list[str]:
    jobs = [(s, m, smoke, weights) for s in shapes for m in rows]
    if smoke:  # the warm-up's plumbing on one job: the timed pass runs every variant
        return _warm(jobs[0])
    with mp.get_context("spawn").Pool(min(workers, len(jobs))) as pool:
        return [e for errs in pool.map(_warm, jobs) for e in errs]


def _weight(N: int, K: int, device, dtype, weights: str
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A random [N, K] weight: bf16, or (weights "int8") its int8 codes and scales."""
    w = torch.randn(N, K, device=device, dtype=dtype) * 0.02
    if weights == "bf16":
        return w, None
    q, s = quantize_int8(w)
    return q, s.to(dtype)


def _skinny(x: torch.Tensor, w: tuple[torch.Tensor, torch.Tensor | None], cfg: dict | None
            ) -> torch.Tensor:
    return skinny_gemm.skinny_gemm(x, w[0], None, cfg, scale=w[1])


def layer_level(shapes, rows, device, dtype, weights: str = "bf16"
                ) -> tuple[list[dict], dict]:
    """Per shape and token count: cuBLAS bf16 (and the prologue before it), every tile of
    the few-token kernel on ``weights`` (bf16, or int8 codes: then also the committed
    int8 GEMM, ``quant_kernels.int8_matmul``), weights rotated past L2."""
    out, picks = [], {}
    for name, N, K, kind in shapes:
        n = copies_past_l2(N * K * 2)
        ws = [torch.randn(N, K, device=device, dtype=dtype) * 0.02 for _ in range(n)]
        qs = ([(w, None) for w in ws] if weights == "bf16" else
              [_weight(N, K, device, dtype, weights) for _ in range(copies_past_l2(N * K))])
        for M in rows:
            x, pro = _inputs(kind, M, K, device, dtype)
            row = {"shape": name, "M": M, "N": N, "K": K, "prologue": kind, "copies": n,
                   "weight_mb": round(N * K * 2 / 1e6, 1), "weights": weights}
            times, ref = cublas_baselines(x, pro, ws, device)
            row.update(times)
            committed = skinny_gemm.config_for(M, N, K)
            timed, failed = {}, {}
            if weights != "bf16":
                w0 = dequantize_int8(*qs[0]).to(dtype)
                ref = unfused(x, pro, partial(F.linear, weight=w0)).float()
                gemm = qk.CONFIGS["int8"][skinny_gemm.bucket(M)]  # never a committed tile
                calls = [partial(unfused, x, pro,
                                 partial(qk.int8_matmul, q=q, scale=s, config=gemm))
                         for q, s in qs]
                # (the interpreter's tl.dot misreads bf16: the int8 GEMM only on CUDA)
                row["int8_gemm_us"] = (checked_time(calls, ref, device)
                                       if device.type == "cuda" else None)
                committed = None
            for cfg in configs() + ([None] if committed else []):
                key = "committed" if cfg is None else json.dumps(cfg, sort_keys=True)
                calls = [partial(unfused, x, pro, partial(_skinny, w=w, cfg=cfg)) for w in qs]
                try:
                    timed[key] = checked_time(calls, ref, device)
                except Exception as exc:
                    failed[key] = repr(exc)[:200]
            variants = {k: t for k, t in timed.items() if k != "committed"}
            best = min(variants, key=variants.get)
            picks[(skinny_gemm.bucket(M), N, K)] = json.loads(best)
            row.update(skinny_us=variants, failed=failed, best=json.loads(best),
                       best_us=variants[best], committed=committed,
                       committed_us=timed.get("committed"))
            out.append(row)
        del ws, qs
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out, picks


def engine_ab(weights: list[str]) -> list[dict]:
    """engine_level per weight format: PDL off, on, and (bf16) on with the few-token matmul
    (``backend.model``'s Triton step ops swapped for this process)."""
    base, rows = fused_ops.TRITON, []
    for w in weights:
        ways = [(False, False), (True, False)] + ([(True, True)] if w == "bf16" else [])
        for on_pdl, few in ways:
            pdl.ENABLED = on_pdl
            model_module.TRITON = dataclasses.replace(base, few_token_matmul=few)
            rows.append(dict(engine_level(w, 32, batches=ENGINE_BATCHES), pdl=on_pdl,
                             few_token_matmul=few))
    pdl.ENABLED, model_module.TRITON = True, base
    return rows


def _write(path: str, result: dict) -> None:
    """Written after each stage, so a run cut short keeps what it measured."""
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--rows", default="16,32,64,128")
    ap.add_argument("--chain-rows", default="16,64")
    ap.add_argument("--engine", default="", help="weight formats, e.g. bf16,int8")
    ap.add_argument("--workers", type=int, default=14)
    ap.add_argument("--install", action="store_true",
                    help="run the chain and engine with this run's picks, not the committed")
    ap.add_argument("--weights", default="bf16", choices=("bf16", "int8"),
                    help="the weights the few-token kernel reads (int8: codes and scales, "
                         "against the int8 GEMM and cuBLAS bf16; no chain or install)")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.bfloat16
    shapes = SHAPES_SMOKE if args.smoke else SHAPES_7B
    rows = [int(r) for r in args.rows.split(",") if r]
    t0 = time.perf_counter()
    result: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                    "torch": torch.__version__, "rows": rows, "pdl": pdl.enabled(device)}
    result["copy_gbs"] = copy_gbs(device)
    result["compile_errors"] = precompile(shapes, rows, args.smoke, args.workers, args.weights)
    result["compile_s"] = round(time.perf_counter() - t0, 1)
    layers, picks = layer_level(shapes, rows, device, dtype, args.weights)
    result["layers"] = layers
    result["picks"] = {f"{m}x{n}x{k}": c for (m, n, k), c in picks.items()}
    _write(args.json, result)
    if args.install and args.weights == "bf16":
        skinny_gemm.CONFIGS.update(picks)
    if not args.smoke and args.weights == "bf16":
        result["chain"] = []
        variants = {name: dataclasses.replace(fused_ops.TRITON, few_token_matmul=on)
                    for name, on in (("cublas", False), ("skinny", True))}
        for M in (int(r) for r in args.chain_rows.split(",") if r):
            result["chain"].append(dict(chain_level("bf16", device, dtype, tokens=M,
                                                    variants=variants), tokens=M))
            torch.cuda.empty_cache()
            _write(args.json, result)
    if args.engine:
        result["engine"] = engine_ab(args.engine.split(","))
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    _write(args.json, result)
    print(f"copy {result['copy_gbs']} GB/s; compile errors {len(result['compile_errors'])} "
          f"({result['compile_s']} s)")
    for r in layers:
        committed = f"{r['committed_us']:7.1f}" if r["committed_us"] else "   (cuBLAS)"
        if r.get("int8_gemm_us"):
            committed = f"{r['int8_gemm_us']:7.1f} (int8 GEMM)"
        print(f"M={r['M']:3d} {r['shape']:8s} cublas {r['cublas_us']:7.1f} prologue+cublas "
              f"{r['unfused_us']:7.1f} prologue+skinny committed {committed} best "
              f"{r['best_us']:7.1f} {r['best']}")
    for c in result.get("chain", []) + result.get("engine", []):
        print(json.dumps(c))


if __name__ == "__main__":
    main()
