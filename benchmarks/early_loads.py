"""Two kernels compiled for sm_90 on a host without a GPU (``benchmarks.sass``), with their
first loads before the wait for the previous kernel (EARLY) and without: registers a
thread, local-memory spills, global loads (LDG) and cp.async copies (LDGSTS) before and
after the wait (``griddepcontrol.wait``, ACQBULK in SASS).
- the int4 g128 one-token word-wise GEMV, per epilogue: 64 rows a program, two warps, three
  stages, bf16 x, as the engine launches it on Llama-2-7B's shapes;
- the paged decode kernel: Llama-2-7B's heads (one query head per KV head, head_dim 128), a
  bf16 cache in 16-token blocks, the engine's split and unsplit tiles; the int8 cache's
  tiles without EARLY (it serves float caches only).
With ``--sass-dir`` the SASS of each is kept, to compare two trees byte for byte.

    python -m benchmarks.early_loads OUT_JSON [--sass-dir D]
"""
import argparse
import json
import os

import triton

from backend.layers import quant_kernels as qk
from backend.layers import triton_attention as ta
from benchmarks.sass import Compiled, compile_sm90

GEMV_TYPES = dict(x_ptr="*bf16", p_ptr="*i32", sm_ptr="*bf16", y_ptr="*bf16",
                  part_ptr="*fp32", cnt_ptr="*i32", nw_ptr="*bf16", ss_ptr="*fp32",
                  res_ptr="*bf16", eps="fp32")
GEMV = dict(G=128, BLOCK_N=64, GROUPS=1, STAGES=3, BF16=True, PDL=True, SS_N=1)
GEMV_CASES = {"plain_split": dict(EVEN=True, PARTIAL=True, EPI=qk.PLAIN),
              "plain_unsplit": dict(EVEN=True, PARTIAL=False, EPI=qk.PLAIN),
              "plain_cut_rows": dict(EVEN=False, PARTIAL=True, EPI=qk.PLAIN),
              "added": dict(EVEN=True, PARTIAL=True, EPI=qk.ADDED),
              "normed": dict(EVEN=True, PARTIAL=True, EPI=qk.NORMED)}
# pointers and strides as the engine's tensors give them (multiples of 16); the block
# table's stride is not specialised
DECODE_ALIGNED = ["q_ptr", "cache_ptr", "scale_ptr", "bt_ptr", "ctx_ptr", "out_ptr",
                  "part_o_ptr", "part_lse_ptr", "stride_qt", "stride_qh", "stride_cs",
                  "stride_cc", "stride_ch", "stride_sc", "stride_sh", "stride_ot", "stride_oh"]
DECODE_CASES = {  # name: (cache kind, splits, rows mode)
    "bf16_split": ("auto", 16, 0), "bf16_unsplit": ("auto", 1, 0),
    "int8_split": ("int8", 16, 0), "int8_unsplit_rows": ("int8", 1, 3)}


def gemv(case: dict, early: bool) -> Compiled:
    """The int4 one-token GEMV with ``case``'s constexprs."""
    return compile_sm90(qk._int4_gemv_words, GEMV_TYPES, dict(GEMV, **case, EARLY=early),
                        list(GEMV_TYPES)[:-1] + ["K", "hw"], num_warps=2, num_stages=3)


def decode(kind: str, splits: int, rows: int, early: bool) -> Compiled:
    """The decode kernel over a ``kind`` cache on ``splits`` splits (``rows``: the CUDA-core
    path's mode) with the engine's tile."""
    block_n, warps, stages = ta.decode_tile(kind, splits)
    types = dict(q_ptr="*bf16", cache_ptr="*i8" if kind == "int8" else "*bf16",
                 scale_ptr="*fp32", bt_ptr="*i32", ctx_ptr="*i32", out_ptr="*bf16",
                 part_o_ptr="*fp32", part_lse_ptr="*fp32", qk_scale="fp32")
    consts = dict(GROUP=1, G_PAD=1 if rows else 16, HD=128, HD_PAD=128, BLOCK_SIZE=16,
                  BLOCK_N=block_n, NUM_SPLITS=splits, QUANT=ta.QUANT_CODES[kind],
                  DOT_PREC="tf32", UPCAST=False, V_T=kind in ta.TRANSPOSED_V,
                  HEADS_FIRST=True, ROWS=rows, PDL=True, EARLY=early)
    return compile_sm90(ta._decode_kernel, types, consts, DECODE_ALIGNED, warps, stages)


def builds():
    """(name, compiled kernel) of every case, compiled as they are taken."""
    for early in (False, True):
        tag = "early" if early else "default"
        for name, case in GEMV_CASES.items():
            yield f"gemv_{tag}_{name}", gemv(case, early)
        for name, (kind, splits, rows) in DECODE_CASES.items():
            if not (early and kind != "auto"):  # float caches only
                yield f"decode_{tag}_{name}", decode(kind, splits, rows, early)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--sass-dir")
    args = ap.parse_args()
    if args.sass_dir:
        os.makedirs(args.sass_dir, exist_ok=True)
    res = {"triton": triton.__version__, "target": "sm_90"}
    for name, k in builds():
        if args.sass_dir:
            with open(os.path.join(args.sass_dir, name + ".sass"), "w") as f:
                f.write(k.sass)
        res[name] = k.around_the_wait()
        print(name, res[name], flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
