"""The int8 K/V decode attention of an eager step at small batches: one Llama-2-7B layer
(32 KV heads of 128), split as a kind not in ``EAGER_UNSPLIT`` is (``decode_splits``, int8
taken out of the list for that: a second kernel merges the splits) against unsplit grids
on candidate (tile, rows mode) pairs. Per batch and context: GPU µs in a CUDA graph (no
host in it), host µs a call (launches queued, no sync), and each candidate's largest
difference from the split output. The candidate with the least GPU time at batch 8 x 544
tokens (the ablation's row 4) is written as ``best``.

    [BATCHES=1,4,8,16] [CONTEXTS=544,1024] python docs/benchmarks/step/eager-int8/probe.py OUT_JSON
"""
import json
import os
import sys
import time

import torch
import triton.testing

from backend.layers import triton_attention as ta
from backend.layers.kv_cache import KVCache

dev = torch.device("cuda")
H, hd, bs = 32, 128, 16
# (block_n, num_warps, num_stages), rows mode (0: tl.dot; 3: CUDA cores, fp32 widening)
CANDIDATES = [((32, 1, 3), 3), ((32, 2, 3), 3), ((64, 1, 3), 3), ((64, 2, 3), 3),
              ((64, 2, 3), 0), ((64, 4, 3), 3), ((64, 4, 3), 0), ((128, 4, 3), 3),
              ((128, 4, 3), 0), ((128, 8, 3), 3)]


def host_us(fn, reps: int = 300) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    us = (time.perf_counter() - t) / reps * 1e6
    torch.cuda.synchronize()
    return us


res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
       "triton": triton.__version__, "candidates": CANDIDATES, "rows": []}
gen = torch.Generator(device=dev).manual_seed(0)
for batch in map(int, os.environ.get("BATCHES", "1,4,8,16").split(",")):
    for ctx in map(int, os.environ.get("CONTEXTS", "544,1024").split(",")):
        per = -(-ctx // bs)
        cache = KVCache(1, batch * per, bs, H, hd, torch.bfloat16, "int8", dev)
        cache.data.copy_(torch.randint(-127, 128, cache.data.shape, device=dev,
                                       dtype=torch.int8, generator=gen))
        cache.scales.copy_(torch.rand(cache.scales.shape, device=dev, generator=gen) * 0.02)
        tables = torch.arange(batch * per, device=dev, dtype=torch.int32).view(batch, per)
        lens = torch.full((batch,), ctx, device=dev, dtype=torch.int32)
        q = torch.randn(batch, H, hd, device=dev, dtype=torch.bfloat16, generator=gen)
        listed = ta.EAGER_UNSPLIT.pop("int8", None)  # the split grid of the rule before
        splits = ta.decode_splits(batch, H, ctx, dev, "int8")
        if listed is not None:
            ta.EAGER_UNSPLIT["int8"] = listed
        ref = torch.empty_like(q)

        def call(out, n, tile=None, rows=None):
            bn, w, st = tile or (None, None, None)
            return lambda: ta.paged_decode(q, cache.data[0], cache.scales[0], tables, lens,
                                           out, hd ** -0.5, bs, "int8", n, block_n=bn,
                                           num_warps=w, num_stages=st, rows=rows)
        call(ref, splits)()
        row = {"batch": batch, "context": ctx, "splits": splits,
               "split_gpu_us": round(triton.testing.do_bench_cudagraph(call(ref, splits),
                                                                       rep=50) * 1e3, 2),
               "split_host_us": round(host_us(call(torch.empty_like(q), splits)), 2),
               "unsplit": []}
        for tile, rows in CANDIDATES:
            out = torch.empty_like(q)
            fn = call(out, 1, tile, rows)
            fn()
            row["unsplit"].append({
                "tile": tile, "rows": rows,
                "gpu_us": round(triton.testing.do_bench_cudagraph(fn, rep=50) * 1e3, 2),
                "host_us": round(host_us(fn), 2),
                "max_diff": (out.float() - ref.float()).abs().max().item()})
        res["rows"].append(row)
        top = min(row["unsplit"], key=lambda c: c["gpu_us"])
        print(batch, ctx, "split", splits, row["split_gpu_us"], "us GPU",
              row["split_host_us"], "us host; best unsplit", top, flush=True)
r8 = next(r for r in res["rows"] if r["batch"] == 8 and r["context"] == 544)
best = min(r8["unsplit"], key=lambda c: c["gpu_us"])
res["best"] = [list(best["tile"]), best["rows"]]
print("best at 8 x 544:", res["best"], flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
