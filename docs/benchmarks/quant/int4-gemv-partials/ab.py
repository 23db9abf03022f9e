"""The engine's int4 g128 batch-1 decode step (synthetic Llama-2-7B, 16-token prompts, CUDA
graphs) with the RMSNorm split between the one-token GEMVs (``quant_kernels.SPLIT_NORM``,
``FIRSTTOKEN_SPLIT_NORM=1``) and without it (the add + RMSNorm kernel between them); and,
as an upper bound of what removing those kernels could win, without the split and with the
norm kernel replaced by nothing (``no_norm``: the step computes garbage, only its time
means anything). ``early`` / ``split_early``: the same two with the int4 GEMVs' first weight
loads before the wait for the previous kernel (``quant_kernels.EARLY_WEIGHTS``,
``FIRSTTOKEN_INT4_EARLY=1``). Each variant builds its own engine; variants alternate, ROUNDS
rounds.

    [ROUNDS=2] [VARIANTS=split,kernel] python docs/benchmarks/quant/int4-gemv-partials/ab.py OUT
"""
import dataclasses
import json
import os
import sys
import time

import backend.model as model_mod
from backend.layers import quant_kernels
from backend.layers.fused_ops import TRITON
from benchmarks.quant import engine_level


def no_norm(x, residual, weight, eps):  # no kernel: x as the normed row, residual unchanged
    return x, (x if residual is None else residual)


VARIANTS = {"split": (True, False, {}), "kernel": (False, False, {}),
            "no_norm_bound": (False, False, {"add_rms_norm": no_norm}),
            "early": (False, True, {}), "split_early": (True, True, {})}
if os.environ.get("VARIANTS"):  # a subset, by name
    VARIANTS = {v: VARIANTS[v] for v in os.environ["VARIANTS"].split(",")}
was = quant_kernels.SPLIT_NORM, quant_kernels.EARLY_WEIGHTS
res = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "runs": []}
for rnd in range(int(os.environ.get("ROUNDS", "2"))):
    for name, (split, early, fields) in VARIANTS.items():
        quant_kernels.SPLIT_NORM, quant_kernels.EARLY_WEIGHTS = split, early
        model_mod.TRITON = dataclasses.replace(TRITON, **fields)
        r = engine_level("int4", 128, decode_tokens=64, batches=(1,))
        r["variant"], r["round"] = name, rnd
        res["runs"].append(r)
        print(name, rnd, r["step_ms_batch1"], flush=True)
        json.dump(res, open(sys.argv[1], "w"), indent=1)
model_mod.TRITON = TRITON
quant_kernels.SPLIT_NORM, quant_kernels.EARLY_WEIGHTS = was
