"""Variants of the int4 g128 one-token GEMV's launch (a register cap for more programs per
multiprocessor, pipeline depth, rows per program), per Llama-2-7B shape with codes and
records rotated past L2; then the engine's batch-1 step with the committed tile and the
fastest variant, alternating in one process.

    python regs_probe.py OUT_JSON
"""
import json
import sys
import time
from functools import partial

import torch

from backend.layers import quant_kernels as qk
from backend.layers.quantize import quantize_int4
from benchmarks.quant import copies_past_l2, engine_level, rel_err, time_rotating
from benchmarks.quant_sweep import SHAPES_7B, SWEEP_ROTATE_BYTES, copy_gbs

dev = torch.device("cuda")
G = 128
BASE = dict(qk.CONFIGS["int4-g128"][1])
VARIANTS = {
    "committed": BASE,
    "regs128": dict(BASE, maxnreg=128),
    "regs112": dict(BASE, maxnreg=112),
    "regs96": dict(BASE, maxnreg=96),
    "regs128_pps6": dict(BASE, maxnreg=128, PROGRAMS_PER_SM=6),
    "regs128_stages4": dict(BASE, maxnreg=128, STAGES=4),
    "regs128_stages2": dict(BASE, maxnreg=128, STAGES=2),
    "rows32_w1_regs128": dict(BASE, BLOCK_N=32, num_warps=1, maxnreg=128, PROGRAMS_PER_SM=8),
    "rows64_w4_regs128": dict(BASE, num_warps=4, maxnreg=128),
}
res = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
       "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
       "copy_gbs": round(copy_gbs(dev), 1), "variants": {k: dict(v) for k, v in VARIANTS.items()},
       "us": {k: {} for k in VARIANTS}, "rel_err": {k: {} for k in VARIANTS}}
print(res["gpu"], res["copy_gbs"], flush=True)
for name, N, K in SHAPES_7B:
    gen = torch.Generator(device=dev).manual_seed(0)
    g = quantize_int4(torch.randn(N, K, device=dev, generator=gen) * 0.02, G)
    packed = qk.pack_int4(g.codes)
    sm = qk.pack_scale_min(g.scale.to(torch.bfloat16), g.min.to(torch.bfloat16))
    ref = qk.dequantize_int4(packed, sm, G).float()
    x = torch.randn(1, K, device=dev, generator=gen).to(torch.bfloat16)
    want = x.float() @ ref.T
    n = copies_past_l2(packed.numel() + sm.numel() * 2, SWEEP_ROTATE_BYTES)
    copies = [(packed, sm)] + [(packed.clone(), sm.clone()) for _ in range(n - 1)]
    for vname, cfg in VARIANTS.items():
        try:
            y = qk.int4_matmul(x, packed, sm, G, config=cfg)
            res["rel_err"][vname][name] = rel_err(y, want)
            res["us"][vname][name] = round(time_rotating(
                [partial(qk.int4_matmul, x, p, s, G, cfg) for p, s in copies], dev), 2)
        except Exception as e:  # noqa: BLE001 - a variant that does not compile is reported
            res["us"][vname][name] = repr(e)[:200]
        print(name, vname, res["us"][vname][name], flush=True)
    del copies
block = {k: round(sum(v.values()), 2) for k, v in res["us"].items()
         if all(isinstance(t, float) for t in v.values()) and len(v) == 4}
res["block_us"] = block
best = min(block, key=block.get)
res["best"] = best
print("block", block, "best", best, flush=True)
res["engine"] = []
for rnd in range(2):
    for vname in ("committed", best):
        qk.CONFIGS["int4-g128"][1] = VARIANTS[vname]
        r = engine_level("int4", G, decode_tokens=64, batches=(1,))
        r["variant"], r["round"] = vname, rnd
        res["engine"].append(r)
        print(r, flush=True)
qk.CONFIGS["int4-g128"][1] = BASE
json.dump(res, open(sys.argv[1], "w"), indent=1)
