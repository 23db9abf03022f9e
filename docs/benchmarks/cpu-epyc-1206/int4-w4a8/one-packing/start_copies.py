"""The dense copies a SmolLM2 CPU engine builds at start (the defaults: int4 layers on the
int4 x int8 op, copies kept): how many builds and their seconds, and the engine's build.

  PYTHONPATH=. python docs/benchmarks/cpu-epyc-1206/int4-w4a8/one-packing/start_copies.py \
      [--torch-ops]  # the op's codes dequantised by torch ops, not the library's op

Prints one JSON line. Runs in any tree that has ``_QuantizedLinear._build_copy`` (the tree
before the copies were built once ran it too: ``git worktree add /tmp/before REV``).
"""
import json
import sys
import time

import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.layers import cpu_w4a8, linear
from backend.weights.loader import load_model_source

builds: list[float] = []
build_copy = linear._QuantizedLinear._build_copy


def timed(self):
    t0 = time.perf_counter()
    out = build_copy(self)
    builds.append(time.perf_counter() - t0)
    return out


if __name__ == "__main__":
    linear._QuantizedLinear._build_copy = timed
    torch_ops = "--torch-ops" in sys.argv
    if torch_ops:  # keep the library's dequantising op from being resolved at load
        load = cpu_w4a8.load

        def load_without_dequant(directory):
            ok = load(directory)
            cpu_w4a8._dequant_op = None
            return ok

        cpu_w4a8.load = load_without_dequant
    source = load_model_source("smollm2-135m-instruct")
    t0 = time.perf_counter()
    eng = LLMEngine(EngineConfig(), source)
    total = time.perf_counter() - t0
    print(json.dumps({"torch_ops": torch_ops, "copy_builds": len(builds),
                      "copy_build_s": sum(builds), "engine_build_s": total,
                      "int4_w4a8": eng.stats().cpu_aot_kernels.get("int4_w4a8", {}).get("status"),
                      "copies": eng.stats().prefill_dense_weights.get("layers"),
                      "torch_threads": torch.get_num_threads()}))
