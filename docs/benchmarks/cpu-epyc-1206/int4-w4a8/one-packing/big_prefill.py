"""A model whose dense copies do not fit the CPU's budget (synthetic Llama-2-7B, int4 g32
on the int4 x int8 op, torch's packing released): the first token of a prompt, its prefill
dequantising every layer per call from the op's codes, by the library's op against by torch
ops, alternating in one process (prefix caching off: both ways prefill the same prompt
whole, and must give the same first token).

  PYTHONPATH=. python docs/benchmarks/cpu-epyc-1206/int4-w4a8/one-packing/big_prefill.py \
      PROMPT_TOKENS[,PROMPT_TOKENS...] ROUNDS

Prints one JSON line.
"""
import json
import resource
import statistics
import sys
import time

import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.layers import cpu_w4a8
from backend.weights.loader import load_model_source


def main(prompt_lengths: list[int], rounds: int) -> dict:
    t0 = time.perf_counter()
    eng = LLMEngine(EngineConfig(weights_dtype="int4", cpu_aot_kernels="build",
                                 enable_prefix_caching=False, kv_cache_memory_gib=0.5,
                                 max_model_len=1024, max_num_seqs=4),
                    load_model_source("synthetic:llama-2-7b"))
    build_s = time.perf_counter() - t0
    s = eng.stats()
    params = SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0)
    op = cpu_w4a8._dequant_op
    ways = {"library op": op, "torch ops": None}
    names = list(ways)
    per_length = {}
    for n in prompt_lengths:
        times: dict[str, list[float]] = {k: [] for k in ways}
        firsts: dict[str, list] = {k: [] for k in ways}
        for r in range(rounds):
            prompt = [(37 * r + 11 * n + j) % 30000 + 10 for j in range(n)]
            for name in names[r % 2:] + names[:r % 2]:
                cpu_w4a8._dequant_op = ways[name]
                t = time.perf_counter()
                out = eng.generate([prompt], params)
                times[name].append(time.perf_counter() - t)
                firsts[name].append(out[0][0])
        cpu_w4a8._dequant_op = op
        per_length[n] = {
            "first_token_s_median": {k: statistics.median(v) for k, v in times.items()},
            "first_token_s": times,
            "same_first_tokens": firsts["library op"] == firsts["torch ops"]}
    return {"model": "synthetic:llama-2-7b", "weights": s.weights_format,
            "prefill_kernel": s.prefill_kernel,
            "prefill_dense_weights": s.prefill_dense_weights,
            "int4_w4a8": s.cpu_aot_kernels.get("int4_w4a8"), "engine_build_s": build_s,
            "rounds": rounds, "prompt_tokens": per_length,
            "max_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "torch_threads": torch.get_num_threads()}


if __name__ == "__main__":
    with torch.inference_mode():
        print(json.dumps(main([int(n) for n in sys.argv[1].split(",")], int(sys.argv[2]))))
