"""A/B in one process: the CPU engine (SmolLM2, the CPU defaults: the file's Q4_1 codes as
int4) with its int4 layers' calls of few rows through torch's int4 kernel ("model":
``--cpu-int4-activations model``) or through the int4 x int8 op with the activations in one
or two int8 parts ("int8", "int8x2"); three engines, each on its own copy of the model (the
op is attached per model), alternating round by round, the order swapped every round. Per
round and engine: the mean decode step of ``batch`` sequences with PROMPT-token prompts over
32 steps after their prefills (``int8-kv-rows/ab.alternate``). Missing layer packages are
compiled at start (``--cpu-aot-kernels build``).

    PYTHONPATH=. python docs/benchmarks/cpu-epyc-1206/int4-w4a8/ab.py [ROUNDS] [BATCHES] [PROMPT]
"""
import json
import os
import sys

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.weights.loader import load_model_source

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "int8-kv-rows"))
from ab import alternate, arguments  # noqa: E402  (the int8-kv-rows A/B)


def main() -> None:
    rounds, batches, prompt = arguments()
    src = load_model_source("smollm2-135m-instruct")
    cfg = dict(kv_cache_memory_gib=0.5, max_model_len=1024, max_num_seqs=64,
               enable_prefix_caching=False)
    engines = {a: LLMEngine(EngineConfig(cpu_int4_activations=a, cpu_aot_kernels="build",
                                         **cfg), src)
               for a in ("model", "int8", "int8x2")}
    for name, eng in engines.items():
        status = eng.runner.aot_kernels.int4_w4a8["status"]
        assert (status == "off") == (name == "model"), f"{name}: {status} (make model)"
        assert eng.runner.model.few_rows_layers is not None, "no layer pieces: make model"
    print(json.dumps(alternate(engines, rounds, batches, prompt)))


if __name__ == "__main__":
    main()
