"""Kernel-only times of the Triton attention kernels over tile configs, on CUDA.

Each config is captured in a CUDA graph of repeated calls and timed by replay
(``benchmarks.quant.graph_time_us``), so the figure is the kernels' own time with no Python
launch cost (``benchmarks.attention`` times single calls with ``do_bench``, launch
included). Two questions, one run:
- decode: block_n / num_warps / num_stages per KV dtype, in both grid orders (KV heads or
  sequences fastest), at batches 1-128 and contexts 544 and 4k (the engine's CUDA graphs
  cannot pick a tile by context: one config per dtype and split count must serve all);
- prefill: one 512-token prompt alone in the grid (``chunks=1``) and in a grid with the 8
  chunk slots of a graphed prefill step (``chunks=8``, the other slots empty).

``python -m benchmarks.attention_tiles --json PATH`` (GPU only).
"""
from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import torch

from backend.layers import triton_attention as ta
from benchmarks.attention import BS, DEV, HD, H, KVH, _paged
from benchmarks.quant import graph_time_us

DECODE_SHAPES = ((64, 544), (128, 544), (32, 544), (64, 4096), (32, 4096), (8, 4096),
                 (8, 544), (1, 544))
# (block_n, num_warps, num_stages); the engine's default per dtype and grid is timed first
DECODE_TILES = ((32, 2, 2), (32, 2, 3), (32, 2, 4), (64, 2, 2), (64, 2, 3), (64, 2, 4),
                (64, 4, 2), (64, 4, 3), (128, 2, 3), (128, 4, 3), (32, 4, 2), (32, 1, 2))
PREFILL_TILES = ((128, 64, 8, 2), (64, 64, 4, 2), (64, 32, 4, 2), (128, 128, 8, 2))


def decode_tiles(kinds: list[str], gen: torch.Generator) -> list[dict]:
    """Every tile in both grid orders (KV heads or sequences fastest) per shape."""
    rows = []
    for kind in kinds:
        for batch, ctx in DECODE_SHAPES:
            cache, scales, tables = _paged(batch, ctx, kind, gen)
            q = torch.randn(batch, H, HD, dtype=torch.bfloat16, device=DEV, generator=gen)
            out = torch.empty_like(q)
            lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEV)
            splits = ta.decode_splits(batch, KVH, None, DEV)  # as in the engine's graphs
            default = ta.decode_tile(kind, splits)
            shape_rows = []
            for heads_first in (ta.DECODE_HEADS_FIRST, not ta.DECODE_HEADS_FIRST):
                for bn, warps, stages in [default, *(t for t in DECODE_TILES if t != default)]:
                    us = graph_time_us(partial(
                        ta.paged_decode, q, cache, scales, tables, lens, out, HD ** -0.5, BS,
                        kind, splits, block_n=bn, num_warps=warps, num_stages=stages,
                        heads_first=heads_first), iters=10)
                    shape_rows.append(dict(
                        kind=kind, batch=batch, context=ctx, splits=splits, block_n=bn,
                        num_warps=warps, num_stages=stages, heads_first=heads_first, us=us,
                        default=(bn, warps, stages) == default
                        and heads_first == ta.DECODE_HEADS_FIRST))
            best = min(shape_rows, key=lambda r: r["us"])
            dflt = next(r for r in shape_rows if r["default"])
            print(f"decode {kind:5s} {batch:3d} x {ctx:5d}: default {dflt['us']:8.1f} us, best "
                  f"{best['us']:8.1f} us ({best['block_n']}/{best['num_warps']}/"
                  f"{best['num_stages']}, heads first: {best['heads_first']})", flush=True)
            rows += shape_rows
            del cache, scales
            torch.cuda.empty_cache()
    return rows


def prefill_tiles(gen: torch.Generator, tokens: int = 512) -> list[dict]:
    cache, _, one = _paged(1, tokens, "auto", gen)
    q = torch.randn(tokens, H, HD, dtype=torch.bfloat16, device=DEV, generator=gen)
    out = torch.empty_like(q)
    rows = []
    for chunks in (1, 8):
        tables = torch.zeros(chunks, one.shape[1], dtype=torch.int32, device=DEV)
        tables[0] = one[0]
        lens = torch.zeros(chunks, dtype=torch.int32, device=DEV)
        lens[0] = tokens
        starts = torch.full((chunks + 1,), tokens, dtype=torch.int32, device=DEV)
        starts[0] = 0
        for bm, bn, warps, stages in PREFILL_TILES:
            us = graph_time_us(partial(
                ta.paged_prefill, q, cache, None, tables, lens, starts, out, HD ** -0.5,
                BS, "auto", block_m=bm, block_n=bn, num_warps=warps, num_stages=stages))
            rows.append(dict(tokens=tokens, chunks=chunks, block_m=bm, block_n=bn,
                             num_warps=warps, num_stages=stages, us=us))
            print(f"prefill {tokens} tokens, {chunks} chunk slots, {bm}/{bn}/{warps}/{stages}: "
                  f"{us:.1f} us", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--kinds", default="auto,int8", help="decode KV dtypes")
    args = ap.parse_args(argv)
    gen = torch.Generator(device=DEV).manual_seed(1)
    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "prefill": prefill_tiles(gen), "decode": decode_tiles(args.kinds.split(","), gen)}
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
