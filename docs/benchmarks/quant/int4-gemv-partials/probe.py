"""What the int4 g128 one-token GEMV's in-kernel split sum costs, and what an RMSNorm split
between two GEMVs would cost them. The committed GEMV (K split, each program stores fp32
partials, the last of a row block to arrive adds them up behind an acquire-release atomic:
``splits.add_splits``) against:
  * the same arithmetic whose programs only store their partials (a consumer would add the
    ``split`` fp32 rows when it reads them), with the committed grid and with more splits,
    and unsplit grids (plain stores);
  * ``added``: the GEMV with its ADDED epilogue (``quant_kernels.int4_gemv_added``: the
    residual added, the sum's sums of squares by row block; the producer's half of the
    RMSNorm split between two GEMVs: o and down);
  * ``normed``: the GEMV with its NORMED epilogue (``int4_gemv_normed``: x times the norm's
    weight, the sums times the norm's scale; the consumer's half: q|k|v and gate|up).
Per Llama-2-7B shape, codes and records rotated past L2 (benchmarks.quant_sweep's Weights),
CUDA-graph replays, us a call; two rounds.

    python docs/benchmarks/quant/int4-gemv-partials/probe.py OUT_JSON      (GPU)
    TRITON_INTERPRET=1 SMOKE=1 python ... OUT_JSON                           (CPU check)
"""
import json
import os
import sys
import time
from functools import partial

import torch
import triton
import triton.language as tl

from backend.layers import pdl
from backend.layers import quant_kernels as qk
from backend.layers.gpu import multiprocessors
from backend.layers.pdl import release as pdl_release
from backend.layers.pdl import wait as pdl_wait
from backend.layers.quant_kernels import _int4_words_piece
from benchmarks.quant import time_rotating
from benchmarks.quant_sweep import SHAPES_7B, Weights, copy_gbs

SMOKE = os.environ.get("SMOKE") == "1"
dev = torch.device("cpu" if SMOKE else "cuda")
G = 128
BASE = dict(qk.CONFIGS["int4-g128"][1])


@triton.jit
def _parts(x_ptr, p_ptr, sm_ptr, part_ptr, N, K, hw, W_SPLIT, G: tl.constexpr,
           BLOCK_N: tl.constexpr, EVEN: tl.constexpr, STAGES: tl.constexpr,
           BF16: tl.constexpr, PDL: tl.constexpr):
    # program (i, k): rows block i, words [k W_SPLIT, (k + 1) W_SPLIT) of each row half; its
    # fp32 sums into part[k, rows] (plain stores: no counter, no last program)
    pdl_wait(PDL)
    pid_k = tl.program_id(1)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    y = _int4_words_piece(x_ptr, p_ptr, sm_ptr, rn, N, K, hw, pid_k * W_SPLIT,
                          tl.minimum(hw, (pid_k + 1) * W_SPLIT), G, BLOCK_N, 1, EVEN, STAGES,
                          BF16)
    pdl_release(PDL)
    tl.store(part_ptr + pid_k * N + rn, y, mask=rn < N)


def grid(N: int, K: int, bn: int, per_sm: int, max_split: int) -> tuple[int, int]:
    """(programs along K, words per program): K split until ``per_sm`` programs a
    multiprocessor, at most ``max_split`` ways, at least one 128-byte step each."""
    words, step = K // 8, G // 4
    steps = triton.cdiv(words, step)
    target, split = per_sm * multiprocessors(dev, 132), 1
    while triton.cdiv(N, bn) * split < target and split < max_split and steps // (split * 2) >= 1:
        split *= 2
    per = triton.cdiv(steps, split) * step
    return triton.cdiv(words, per), per


def parts(x, packed, sm, out, bn, split, per, nw, stages):
    N, K = packed.shape[0], x.shape[1]
    opts = {} if SMOKE else dict(num_warps=nw, num_stages=3)
    _parts[(triton.cdiv(N, bn), split)](
        x, packed.view(torch.int32), sm, out, N, K, K // 8, per, G=G, BLOCK_N=bn,
        EVEN=N % bn == 0 and (K // 2) % G == 0, STAGES=stages,
        BF16=x.dtype == sm.dtype == torch.bfloat16, **opts, **pdl.launch(x.device))
    return out


def added(x, packed, sm, res):
    return qk._int4_words(x, packed, sm, G, BASE, qk.ADDED, residual=res)


def normed(x, packed, sm, nw, ss):
    return qk._int4_words(x, packed, sm, G, BASE, qk.NORMED, norm_w=nw, ss=ss, eps=1e-5)[0]


# name: (rows a program, warps, programs a multiprocessor aimed at, most splits, stages)
VARIANTS = {
    "parts_p4m8": (64, 2, 4, 8, 3),     # the committed grid, partials only
    "parts_p8m16": (64, 2, 8, 16, 3),
    "parts_p16m32": (64, 2, 16, 32, 3),
    "unsplit64": (64, 2, 0, 1, 3),
    "unsplit32": (32, 1, 0, 1, 3),
}
shapes = (("a", 256, 1024), ("b", 192, 2048)) if SMOKE else SHAPES_7B
res = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
       "gpu": "cpu" if SMOKE else torch.cuda.get_device_name(),
       "copy_gbs": round(copy_gbs(dev), 1), "variants": VARIANTS, "shapes": {}}
print(res["gpu"], res["copy_gbs"], flush=True)
for name, N, K in shapes:
    w = Weights(N, K, dev)
    _, packed, _, _, sm = w.int4[G]
    x = torch.randn(1, K, device=dev).to(w.dtype)
    ref = x.float() @ qk.dequantize_int4(packed, sm, G).float().t()
    err = lambda y: ((y.float() - ref).norm() / ref.norm()).item()  # noqa: E731
    row = {"base_err": err(qk.int4_matmul(x, packed, sm, G, BASE))}
    ways = {"base": w.calls(f"int4-g{G}", dict(BASE, kind="words"), x)}
    rot = list(zip(w._rotated(G, packed), w._rotated((G, "sm"), sm, packed)))
    # the producer's half: y + residual and its sums of squares, against the GEMV then the
    # same sums in torch (the add + RMSNorm kernel's rounding: y in the model dtype first)
    res_in = torch.randn(1, N, device=dev).to(w.dtype)
    h, ss = added(x, packed, sm, res_in)
    h_ref = (qk.int4_matmul(x, packed, sm, G, BASE).float() + res_in.float()).to(w.dtype)
    row["added_same_h"] = bool(torch.equal(h, h_ref))
    row["added_ss_err"] = abs(ss.sum().item() - h_ref.float().pow(2).sum().item()) / \
        h_ref.float().pow(2).sum().item()
    ways["added"] = [partial(added, x, p, s, res_in) for p, s in rot]
    # the consumer's half: x * norm weight through the GEMV, scaled by the rstd of 64 sums
    nw = (1 + 0.1 * torch.randn(K, device=dev)).to(w.dtype)
    ss_in = (x.float().pow(2).sum() / 64 * torch.ones(64, device=dev)).float()
    y = normed(x, packed, sm, nw, ss_in)
    xn = x.float() * nw.float()
    ref_n = xn @ qk.dequantize_int4(packed, sm, G).float().t() \
        * torch.rsqrt(x.float().pow(2).mean() + 1e-5)
    row["normed_err"] = ((y.float() - ref_n).norm() / ref_n.norm()).item()
    ways["normed"] = [partial(normed, x, p, s, nw, ss_in) for p, s in rot]
    for v, (bn, nw, ps, ms, st) in VARIANTS.items():
        split, per = grid(N, K, bn, ps, ms)
        out = torch.zeros(split, N, device=dev, dtype=torch.float32)
        y = parts(x, packed, sm, out, bn, split, per, nw, st).sum(0, keepdim=True)
        row[v + "_split"], row[v + "_err"] = split, err(y)
        ways[v] = [partial(parts, x, p, s, out, bn, split, per, nw, st) for p, s in rot]
    for rnd in ("", "_again"):
        for label, calls in ways.items():
            row[label + rnd + "_us"] = round(time_rotating(calls, dev), 2)
    res["shapes"][name] = row
    print(name, {k: v for k, v in row.items() if k.endswith("us")}, flush=True)
    print(name, {k: (round(v, 5) if isinstance(v, float) else v) for k, v in row.items()
                 if not k.endswith("us")}, flush=True)
    del w, rot, ways
    if not SMOKE:
        torch.cuda.empty_cache()
for k in ["base", "added", "normed"] + list(VARIANTS):
    for rnd in ("", "_again"):
        res[f"block_{k}{rnd}_us"] = round(sum(r[f"{k}{rnd}_us"] for r in res["shapes"].values()), 2)
print({k: v for k, v in res.items() if k.startswith("block")}, flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
