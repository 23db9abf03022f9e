"""The int4 g128 one-token GEMV as stream-K (``STREAM_GEMV``: even ranges of (64-row block,
128-byte step) units per program of a grid sized to the GPU) against the word-wise GEMV of
a grid of blocks (the default config): per Llama-2-7B shape, codes and records rotated past
L2 (benchmarks.quant_sweep's Weights), us; then the engine's int4 batch-1 step with the
default and with the stream variant of the best block total, alternating in one process.
Needs ``stream-gemv.patch`` applied (``call.sh`` applies it).

    [VARIANTS=name,...] [ROUNDS=2] python stream_probe.py OUT_JSON
"""
import json
import os
import sys
import time
from functools import partial

import torch

from backend.layers import quant_kernels as qk
from benchmarks.quant import engine_level, time_rotating
from benchmarks.quant_sweep import SHAPES_7B, Weights, copy_gbs

dev = torch.device("cuda")
G = 128
BASE = dict(qk.CONFIGS["int4-g128"][1])
VARIANTS = {  # bn, num_warps, per_sm, stages, flat (one pipelined loop across blocks)
    "s64w2p4s3": (64, 2, 4, 3, 0), "s64w2p3s3": (64, 2, 3, 3, 0), "s64w2p6s3": (64, 2, 6, 3, 0),
    "s64w2p4s4": (64, 2, 4, 4, 0), "f64w2p4s3": (64, 2, 4, 3, 1), "f64w2p3s3": (64, 2, 3, 3, 1),
    "f64w2p6s3": (64, 2, 6, 3, 1), "f64w2p4s4": (64, 2, 4, 4, 1), "f64w2p2s4": (64, 2, 2, 4, 1),
    "f32w1p8s3": (32, 1, 8, 3, 1), "f128w4p2s3": (128, 4, 2, 3, 1),
}
if os.environ.get("VARIANTS"):  # a subset, by name
    VARIANTS = {v: VARIANTS[v] for v in os.environ["VARIANTS"].split(",")}
res = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
       "gpu": torch.cuda.get_device_name(), "copy_gbs": round(copy_gbs(dev), 1),
       "variants": VARIANTS, "shapes": {}}
print(res["gpu"], res["copy_gbs"], flush=True)
best = {}
for name, N, K in SHAPES_7B:
    w = Weights(N, K, dev)
    _, packed, _, _, sm = w.int4[G]
    x = (torch.randn(1, K, device=dev) * 1.0).to(w.dtype)
    ref = x.float() @ qk.dequantize_int4(packed, sm, G).float().t()
    base = qk.int4_matmul(x, packed, sm, G, BASE)
    err = lambda y: ((y.float() - ref).norm() / ref.norm()).item()  # noqa: E731
    row = {"base_err": err(base)}
    ways = {"base": w.calls(f"int4-g{G}", dict(BASE, kind="words"), x)}
    rot = list(zip(w._rotated(G, packed), w._rotated((G, "sm"), sm, packed)))
    for v, (bn, nw, ps, st, fl) in VARIANTS.items():
        cfg = dict(BASE, BLOCK_N=bn, num_warps=nw, STREAM_GEMV=ps, STAGES=st, FLAT=fl)
        ys = [qk.int4_matmul(x, packed, sm, G, cfg) for _ in range(3)]
        row[v + "_err"] = err(ys[0])
        row[v + "_stable"] = all(torch.equal(ys[0], y) for y in ys)
        ways[v] = [partial(qk.int4_matmul, x, p, s, G, cfg) for p, s in rot]
    for rnd in ("", "_again"):
        for label, calls in ways.items():
            row[label + rnd + "_us"] = round(time_rotating(calls, dev), 2)
    res["shapes"][name] = row
    ts = {v: row[v + "_us"] + row[v + "_again_us"] for v in VARIANTS}
    best[(N, K)] = min(ts, key=ts.get)
    print(name, {k: v for k, v in row.items() if k.endswith("us")}, "best", best[(N, K)],
          flush=True)
    print(name, {k: (round(v, 5) if isinstance(v, float) else v) for k, v in row.items()
                 if not k.endswith("us")}, flush=True)
    del w, rot, ways
    torch.cuda.empty_cache()
for k in ["base"] + list(VARIANTS):
    res["block_" + k + "_us"] = round(sum(r[k + "_us"] for r in res["shapes"].values()), 2)
    res["block_" + k + "_again_us"] = round(
        sum(r[k + "_again_us"] for r in res["shapes"].values()), 2)
print({k: v for k, v in res.items() if k.startswith("block")}, flush=True)
res["best"] = {f"{n}x{k}": v for (n, k), v in best.items()}
json.dump(res, open(sys.argv[1], "w"), indent=1)

# the engine, int4 g128 batch 1 (16-token prompts), the default GEMV and the stream variant
# of the best block total, alternating
blocks = {v: res[f"block_{v}_us"] + res[f"block_{v}_again_us"] for v in VARIANTS}
top = min(blocks, key=blocks.get)
bn, nw, ps, st, fl = VARIANTS[top]
ways = {"base": BASE,
        "stream": dict(BASE, BLOCK_N=bn, num_warps=nw, STREAM_GEMV=ps, STAGES=st, FLAT=fl)}
res["engine_variant"] = top
res["engine"] = []
for rnd in range(int(os.environ.get("ROUNDS", "2"))):
    for label, cfg in ways.items():
        qk.CONFIGS["int4-g128"][1] = cfg
        r = engine_level("int4", G, decode_tokens=64, batches=(1,))
        r["way"], r["round"] = label, rnd
        res["engine"].append(r)
        print("engine", label, top if label == "stream" else "", rnd, r.get("step_ms_batch1"),
              flush=True)
        json.dump(res, open(sys.argv[1], "w"), indent=1)
qk.CONFIGS["int4-g128"][1] = BASE
