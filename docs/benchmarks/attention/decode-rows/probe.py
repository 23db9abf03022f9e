"""Decode attention with one query head per KV head: the tl.dot path (the query row padded
to 16) against the CUDA-core path (``rows``), kernel time by CUDA-graph replay, per cache
dtype, shape and tile, with each output checked against the committed path's.

    python docs/benchmarks/attention/decode-rows/probe.py OUT.json   (GPU)
"""
from __future__ import annotations

import json
import sys
from functools import partial

import torch

from backend.layers import triton_attention as ta
from benchmarks.attention import BS, DEV, HD, H, KVH, _paged, copy_bandwidth
from benchmarks.quant import graph_time_us

SHAPES = ((64, 544), (128, 544), (32, 544), (64, 4096), (8, 544), (1, 544), (8, 4096))
ROW_TILES = ((16, 1, 3), (32, 1, 2), (32, 1, 3), (32, 1, 4), (32, 2, 3), (64, 2, 3),
             (64, 4, 3), (128, 4, 3), (64, 1, 3))
WIDEN16_TILES = ((16, 1, 3), (32, 1, 3), (64, 2, 3))


def main() -> None:
    out_path = sys.argv[1]
    gen = torch.Generator(device=DEV).manual_seed(0)
    res = {"device": torch.cuda.get_device_name(), "copy_gb_s": copy_bandwidth() / 1e9,
           "rows": []}
    for kind in ("int8", "auto"):
        variants = [(1, t) for t in ROW_TILES]
        if kind == "int8":
            variants += [(w, t) for w in (2, 3) for t in WIDEN16_TILES]
        for batch, ctx in SHAPES:
            cache, scales, tables = _paged(batch, ctx, kind, gen)
            q = torch.randn(batch, H, HD, dtype=torch.bfloat16, device=DEV, generator=gen)
            lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEV)
            splits = ta.decode_splits(batch, KVH, None, DEV)
            kv_bytes = batch * ctx * KVH * HD * 2 * cache.element_size()
            ref = torch.empty_like(q)
            ta.paged_decode(q, cache, scales, tables, lens, ref, HD ** -0.5, BS, kind, splits,
                            rows=0)
            for rows, tile in [(0, None), *variants]:
                kw = dict(rows=rows) if tile is None else dict(
                    rows=rows, block_n=tile[0], num_warps=tile[1], num_stages=tile[2])
                out = torch.full_like(q, float("nan"))
                try:
                    ta.paged_decode(q, cache, scales, tables, lens, out, HD ** -0.5, BS, kind,
                                    splits, **kw)
                    torch.cuda.synchronize()
                    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                    us = graph_time_us(partial(ta.paged_decode, q, cache, scales, tables, lens,
                                               out, HD ** -0.5, BS, kind, splits, **kw),
                                       iters=20)
                except Exception as e:  # a tile that does not compile: recorded, not fatal
                    res["rows"].append(dict(kind=kind, batch=batch, context=ctx, rows=rows,
                                            tile=tile, error=repr(e)[:300]))
                    continue
                row = dict(kind=kind, batch=batch, context=ctx, splits=splits, rows=rows,
                           tile=tile or ta.decode_tile(kind, splits), default=tile is None,
                           us=us, tb_s=kv_bytes / us / 1e6, rel_err_vs_dot=err,
                           nan=bool(out.isnan().any()))
                res["rows"].append(row)
                print(f"{kind:5} {batch:4}x{ctx:<5} s{splits:<2} rows={rows} "
                      f"tile={row['tile']} {us:8.1f} us {row['tb_s']:.2f} TB/s err {err:.1e}"
                      f"{' NaN' if row['nan'] else ''}", flush=True)
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)
    print("best per shape:")
    for kind in ("int8", "auto"):
        for batch, ctx in SHAPES:
            rs = [r for r in res["rows"] if r.get("kind") == kind and r["batch"] == batch
                  and r["context"] == ctx and "us" in r]
            d = next(r for r in rs if r["default"])
            b = min(rs, key=lambda r: r["us"])
            print(f"{kind:5} {batch:4}x{ctx:<5} default {d['us']:7.1f}  best {b['us']:7.1f} "
                  f"rows={b['rows']} tile={b['tile']}")


if __name__ == "__main__":
    main()
