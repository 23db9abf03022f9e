"""The engine's int4 g128 batch-1 decode step (synthetic Llama-2-7B, CUDA graphs, contexts
of PROMPT (default 512) to PROMPT + 65 tokens) with and without each of three changes, each
variant its own engine, variants alternating, ROUNDS rounds:
- ``split``: the RMSNorm split between the one-token GEMVs (``quant_kernels.SPLIT_NORM``,
  ``FIRSTTOKEN_SPLIT_NORM=1``) instead of the add + RMSNorm kernel between them;
- ``early``: the int4 GEMVs' first weight loads before the wait for the previous kernel
  (``quant_kernels.EARLY_WEIGHTS``, ``FIRSTTOKEN_INT4_EARLY=1``);
- ``_all``: also the decode attention's first K/V tile before its wait
  (``triton_attention.DECODE_EARLY``, ``FIRSTTOKEN_ATTN_EARLY=1``);
- ``kernel``: none of them. ``no_norm_bound``: none, and the norm kernel replaced by
  nothing (the upper bound of removing it; the step computes garbage, only its time means
  anything).

    [ROUNDS=2] [PROMPT=512] [VARIANTS=kernel,split] \
        python docs/benchmarks/quant/int4-gemv-partials/ab.py OUT
"""
import dataclasses
import json
import os
import sys
import time

import backend.model as model_mod
from backend.layers import quant_kernels, triton_attention
from backend.layers.fused_ops import TRITON
from benchmarks.quant import engine_level


def no_norm(x, residual, weight, eps):  # no kernel: x as the normed row, residual unchanged
    return x, (x if residual is None else residual)


# name: (split norm, early GEMV weights, early attention tile, step-op fields)
VARIANTS = {"kernel": (False, False, False, {}), "split": (True, False, False, {}),
            "early": (False, True, False, {}), "early_all": (False, True, True, {}),
            "split_early_all": (True, True, True, {}),
            "no_norm_bound": (False, False, False, {"add_rms_norm": no_norm})}
if os.environ.get("VARIANTS"):  # a subset, by name
    VARIANTS = {v: VARIANTS[v] for v in os.environ["VARIANTS"].split(",")}
FLAGS = [(quant_kernels, "SPLIT_NORM"), (quant_kernels, "EARLY_WEIGHTS"),
         (triton_attention, "DECODE_EARLY")]
was = [getattr(m, f) for m, f in FLAGS]
res = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "runs": []}
for rnd in range(int(os.environ.get("ROUNDS", "2"))):
    for name, (*flags, fields) in VARIANTS.items():
        for (module, flag), on in zip(FLAGS, flags):
            setattr(module, flag, on)
        model_mod.TRITON = dataclasses.replace(TRITON, **fields)
        r = engine_level("int4", 128, decode_tokens=64, batches=(1,),
                         prompt_tokens=int(os.environ.get("PROMPT", "512")))
        r["variant"], r["round"] = name, rnd
        res["runs"].append(r)
        print(name, rnd, r["step_ms_batch1"], flush=True)
        json.dump(res, open(sys.argv[1], "w"), indent=1)
model_mod.TRITON = TRITON
for (module, flag), on in zip(FLAGS, was):
    setattr(module, flag, on)
