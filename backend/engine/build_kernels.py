"""Builds the CPU kernels the backend would load compiled ahead of time for a model and its
weight flags (``backend.engine.aot_kernels``), then exits; ``make model`` runs it for the
embedded model.

    python -m backend.engine.build_kernels --model NAME [--dtype ...] [--weights-dtype ...]
"""
from __future__ import annotations

import argparse
import logging
import sys

from backend.engine import aot_kernels
from backend.engine.config import (CPU_INT4_ACTIVATIONS, INT4_GROUP_SIZES, MODEL_DTYPES,
                                   EngineConfig)
from backend.engine.llm_engine import LLMEngine
from backend.layers.linear import LM_HEAD_DTYPES, WEIGHT_DTYPES
from backend.weights.loader import load_model_source


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m backend.engine.build_kernels",
        description="Compile the CPU kernels the backend would load for a model (the int8 LM "
                    "head's one-row GEMV, the int4 x int8 op, the layer pieces for steps of few "
                    "rows, the paged decode attention) into "
                    f"{aot_kernels.kernels_dir()}.")
    parser.add_argument("--model", required=True, help="a preset name or a path, as the backend")
    parser.add_argument("--dtype", default="auto", choices=MODEL_DTYPES)
    parser.add_argument("--weights-dtype", default="auto", choices=WEIGHT_DTYPES)
    parser.add_argument("--lm-head-dtype", default="auto", choices=("auto", *LM_HEAD_DTYPES))
    parser.add_argument("--int4-group-size", type=int, default=32, choices=INT4_GROUP_SIZES)
    parser.add_argument("--cpu-int4-activations", default="int8x2",
                        choices=CPU_INT4_ACTIVATIONS,
                        help="as the backend's flag: int8x2 / int8 build the int4 x int8 op and "
                             "the layer pieces that call it, model the pieces on torch's "
                             "kernel")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config = EngineConfig(device="cpu", dtype=args.dtype, weights_dtype=args.weights_dtype,
                          lm_head_dtype=args.lm_head_dtype,
                          int4_group_size=args.int4_group_size, kv_cache_memory_gib=0.01,
                          cpu_int4_activations=args.cpu_int4_activations,
                          max_num_seqs=1, max_model_len=64, prefill_dense_weights="off",
                          cpu_aot_kernels="build")
    result = LLMEngine(config, load_model_source(args.model)).runner.aot_kernels
    print(f"LM head: {result.lm_head}" + (f" ({result.reason})" if result.reason else "")
          + (f": {result.path}" if result.path else ""))
    few = result.few_rows_layers
    span = f"{few['rows'][0]}-{few['rows'][1]}-row" if "rows" in few else "few-row"
    for name, layers in (("int4 x int8 op", result.int4_w4a8),
                         ("one-token layers", result.layers), (f"{span} layers", few),
                         ("paged decode attention", result.decode_attention)):
        print(f"{name}: {layers['status']}"
              + (f" ({layers['reason']})" if layers["reason"] else "")
              + (f": {layers['path']}" if layers["path"] else ""))
    statuses = (result.lm_head, result.layers["status"], few["status"],
                result.decode_attention["status"], result.int4_w4a8["status"])
    return 1 if "failed" in statuses else 0


if __name__ == "__main__":
    sys.exit(main())
