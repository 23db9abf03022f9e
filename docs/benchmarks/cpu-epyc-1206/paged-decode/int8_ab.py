"""A/B in one process: the CPU engine (SmolLM2, the CPU defaults) with an int8 or a bf16 KV
cache, its decode rows read in place by the paged decode kernel ("...-kernel") or through the
torch path, gather + SDPA ("...-gather": ``attn.cpu_decode`` None), four engines on one
model, alternating round by round, the order swapped every round. Per round and engine: the
mean decode step of ``batch`` sequences with PROMPT-token prompts over 32 steps after their
prefills (``int8-kv-rows/ab.alternate``).

    PYTHONPATH=. python docs/benchmarks/cpu-epyc-1206/paged-decode/int8_ab.py \
        [ROUNDS] [BATCHES] [PROMPT]
"""
import json
import os
import sys

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.weights.loader import load_model_source

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "int8-kv-rows"))
from ab import alternate, arguments, three_engines  # noqa: E402  (the int8-kv-rows A/B)


def main() -> None:
    rounds, batches, prompt = arguments()
    int8, int8_gather, bf16 = three_engines()
    cfg = dict(kv_cache_memory_gib=0.5, max_model_len=1024, max_num_seqs=64,
               enable_prefix_caching=False)
    bf16_gather = LLMEngine(EngineConfig(kv_cache_dtype="auto", **cfg),
                            load_model_source("smollm2-135m-instruct"),
                            model=int8.runner.model)
    for eng in (int8, int8_gather, bf16, bf16_gather):
        assert eng.runner.attn.cpu_decode is not None, "no paged decode kernel: make model"
    int8_gather.runner.attn.cpu_decode = bf16_gather.runner.attn.cpu_decode = None
    engines = {"int8-kernel": int8, "int8-gather": int8_gather, "bf16-kernel": bf16,
               "bf16-gather": bf16_gather}
    print(json.dumps(alternate(engines, rounds, batches, prompt)))


if __name__ == "__main__":
    main()
