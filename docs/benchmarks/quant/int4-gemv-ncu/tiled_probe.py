"""The int4 g128 one-token GEMV reading its codes tile-major (``tiled.patch``: each 64-row
tile's group of 128 columns, 8 KB, one contiguous run) against the row-major codes of the
tree, same tile and arithmetic: same bits expected; per Llama-2-7B shape, codes and
records rotated past L2 (CUDA), µs.

    python tiled_probe.py OUT_JSON        (CPU: TRITON_INTERPRET=1 on small shapes)
"""
import json
import os
import sys
import time
from functools import partial

import torch

from backend.layers import quant_kernels as qk
from backend.layers.quantize import quantize_int4
from benchmarks.quant import copies_past_l2, time_rotating
from benchmarks.quant_sweep import SHAPES_7B, SWEEP_ROTATE_BYTES, copy_gbs

cpu = os.environ.get("TRITON_INTERPRET") == "1"
dev = torch.device("cpu" if cpu else "cuda")
G = 128
BASE = dict(qk.CONFIGS["int4-g128"][1])
TILED = dict(BASE, TILED=1)
BN = BASE["BLOCK_N"]


def tiled(packed: torch.Tensor) -> torch.Tensor:
    """[N, K/2] code bytes -> the same bytes as [N/BN, K/(2G), BN, G] (tile-major)."""
    N, hb = packed.shape
    return packed.view(N // BN, BN, hb // G, G).permute(0, 2, 1, 3).contiguous().view(N, hb)


shapes = (("a", 128, 512), ("b", 192, 1024)) if cpu else SHAPES_7B
res = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
       "gpu": "cpu" if cpu else torch.cuda.get_device_name(),
       "copy_gbs": None if cpu else round(copy_gbs(dev), 1), "shapes": {}}
for name, N, K in shapes:
    gen = torch.Generator(device=dev).manual_seed(0)
    g = quantize_int4(torch.randn(N, K, device=dev, generator=gen) * 0.02, G)
    packed = qk.pack_int4(g.codes)
    sm = qk.pack_scale_min(g.scale.to(torch.bfloat16), g.min.to(torch.bfloat16))
    pt = tiled(packed)
    x = torch.randn(1, K, device=dev, generator=gen).to(torch.bfloat16)
    a = qk.int4_matmul(x, packed, sm, G, BASE)
    b = qk.int4_matmul(x, pt, sm, G, TILED)
    row = {"same_bits": torch.equal(a, b)}
    if not cpu:
        n = copies_past_l2(packed.numel() + sm.numel() * 2, SWEEP_ROTATE_BYTES)
        for label, p0, cfg in (("row_major", packed, BASE), ("tiled", pt, TILED),
                               ("row_major_again", packed, BASE), ("tiled_again", pt, TILED)):
            copies = [(p0, sm)] + [(p0.clone(), sm.clone()) for _ in range(n - 1)]
            row[label + "_us"] = round(time_rotating(
                [partial(qk.int4_matmul, x, p, s, G, cfg) for p, s in copies], dev), 2)
            del copies
    res["shapes"][name] = row
    print(name, row, flush=True)
if not cpu:
    for k in ("row_major_us", "tiled_us", "row_major_again_us", "tiled_again_us"):
        res["block_" + k] = round(sum(r[k] for r in res["shapes"].values()), 2)
    print({k: v for k, v in res.items() if k.startswith("block")}, flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
