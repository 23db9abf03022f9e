"""The engine with each decode-attention way, alternating, one process: synthetic
Llama-2-7B, `benchmarks.attention.bench_engine` (TPOT batch 1, batch-64 steady step, TTFT).

    python docs/benchmarks/attention/decode-rows/engine_ab.py OUT.json KIND ROUNDS WAY...

WAY: ``dot`` (the query row padded for tl.dot, the committed tiles) or
``rows:R:BLOCK_N:WARPS:STAGES`` (``_attend_rows`` with widening R for unsplit grids; split
grids keep their tile and way).
"""
from __future__ import annotations

import json
import sys

import torch

from backend.layers import triton_attention as ta
from benchmarks.attention import bench_engine

KEYS = ("tpot_batch1_ms", "stream_tpot_batch1_ms", "tpot_batch64_ms", "steady_step_batch64_ms",
        "ttft_512_ms", "step_ms_batch32_ctx512_max_len_1k")


def apply(kind: str, way: str, tiles: tuple, rows: tuple) -> None:
    """The committed tiles and ways, or ``way`` for unsplit grids (split grids keep
    theirs)."""
    ta.DECODE_TILES[kind], ta.DECODE_ROWS[kind] = tiles, rows
    if way != "dot":
        _, r, bn, w, st = way.split(":")
        ta.DECODE_TILES[kind] = (tiles[0], (int(bn), int(w), int(st)))
        ta.DECODE_ROWS[kind] = (rows[0], int(r))


def main() -> None:
    out, kind, rounds, ways = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    tiles, rows = ta.DECODE_TILES[kind], ta.DECODE_ROWS[kind]
    runs = []
    for rnd in range(rounds):
        for way in ways:
            apply(kind, way, tiles, rows)
            r = bench_engine("triton", False, kv_cache_dtype=kind)
            runs.append(dict(round=rnd, way=way, **{k: r.get(k) for k in KEYS}))
            print(rnd, way, " ".join(f"{k}={r.get(k):.3f}" for k in KEYS), flush=True)
            torch.cuda.empty_cache()
    with open(out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), kind=kind, runs=runs), f, indent=1)


if __name__ == "__main__":
    main()
