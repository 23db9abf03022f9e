"""The floors at the goodput batch's load (``benchmarks.ablation.load_floors``) for ablation
tables run before the JSON carried them: from each file's own floors (measured at the start
of its run), its workload and its row 7.

    PYTHONPATH=. python docs/benchmarks/step/ablation-lead-step/load_floors.py FILE.json ...
"""
from __future__ import annotations

import json
import sys

import torch

from backend.engine.config import EngineConfig
from backend.weights.loader import load_model_source
from benchmarks.ablation import load_floors
from benchmarks.roofline import Floors, step_cost


def main(paths: list[str]) -> None:
    for path in paths:
        res = json.load(open(path))
        meta, c = res["meta"], res["floors_check"]
        row7 = next(r for r in res["rows"] if r["row"] == 7)
        f = meta["floors"]
        floors = Floors(f["copy_bytes_per_s"], f["matmul_flops_per_s"], f["matmul_n"],
                        f["dtype"])
        kv = row7["config"].get("kv_cache_dtype", "auto")
        dtype = getattr(torch, f["dtype"])
        cost = step_cost(load_model_source(meta["model"]).config, "bf16", "bf16", kv, dtype,
                         EngineConfig().block_size)
        w = load_floors(cost, floors, c["concurrency"], meta["prompt_tokens"],
                        meta["output_tokens"], c["ttft_p50_ms"], c["tpot_p50_ms"])
        print(json.dumps({"file": path, "gpu": meta.get("gpu"), "batch": c["concurrency"],
                          "policy": c["policy"], "kv_cache_dtype": kv,
                          "ttft_p50_ms": c["ttft_p50_ms"], "tpot_p50_ms": c["tpot_p50_ms"],
                          "ttft_floor_ms": c["ttft_floor_ms"],
                          "tpot_floor_ms": c["tpot_floor_ms"], "at_this_load": w}))


if __name__ == "__main__":
    main(sys.argv[1:])
