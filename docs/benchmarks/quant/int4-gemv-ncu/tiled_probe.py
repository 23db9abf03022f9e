"""The int4 g128 one-token GEMV reading its codes tile-major (``tiled.patch``: each 64-row
tile's group of 128 columns, 8 KB, one contiguous run) against the row-major codes of the
tree, same tile and arithmetic: same bits expected; per Llama-2-7B shape, codes and
records rotated past L2 as ``benchmarks.quant_sweep`` rotates them (its ``Weights``), µs.

    python tiled_probe.py OUT_JSON        (CPU: TRITON_INTERPRET=1 on small shapes)
"""
import json
import os
import sys
import time
from functools import partial

import torch

from backend.layers import quant_kernels as qk
from benchmarks.quant import time_rotating
from benchmarks.quant_sweep import SHAPES_7B, Weights, copy_gbs

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
    w = Weights(N, K, dev)
    _, packed, _, _, sm = w.int4[G]
    pt = tiled(packed)
    x = torch.randn(1, K, device=dev, generator=torch.Generator(device=dev).manual_seed(1))
    x = x.to(w.dtype)
    row = {"same_bits": torch.equal(qk.int4_matmul(x, packed, sm, G, BASE),
                                    qk.int4_matmul(x, pt, sm, G, TILED))}
    if not cpu:
        ways = {"row_major": w.calls(f"int4-g{G}", dict(BASE, kind="words"), x),
                "tiled": [partial(qk.int4_matmul, x, p, s, G, TILED) for p, s in
                          zip(w._rotated("tiled", pt), w._rotated((G, "sm"), sm, packed))]}
        for rnd in ("", "_again"):
            for label, calls in ways.items():
                row[label + rnd + "_us"] = round(time_rotating(calls, dev), 2)
    res["shapes"][name] = row
    print(name, row, flush=True)
    del w
if not cpu:
    for k in ("row_major_us", "tiled_us", "row_major_again_us", "tiled_again_us"):
        res["block_" + k] = round(sum(r[k] for r in res["shapes"].values()), 2)
    print({k: v for k, v in res.items() if k.startswith("block")}, flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
