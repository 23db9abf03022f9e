"""The LM head and layer 0's matmuls alone, by rows, in the engine auto builds here.
    PYTHONPATH=. python docs/benchmarks/cpu-avx2-1207/parts.py"""
import time

import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.weights.loader import load_model_source

torch.set_num_threads(2)
e = LLMEngine(EngineConfig(max_model_len=256, kv_cache_memory_gib=0.05),
              load_model_source("smollm2-135m-instruct"))
m, s = e.runner.model, e.stats()
print(s.weights_format, s.lm_head_format, s.linear_kernel, s.lm_head_kernel)


def ms(fn, n=10):
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return round((time.perf_counter() - t) / n * 1e3, 3)


with torch.inference_mode():
    layer = m.layers[0]
    for rows in (1, 2, 3, 4, 8):
        x = torch.randn(rows, 576)
        xs = {"qkv": x, "o": x, "gate_up": x, "down": torch.randn(rows, 1536)}
        parts = {k: ms(lambda k=k: getattr(layer, k)(xs[k])) for k in xs}
        print(rows, "head ms", ms(lambda: m.lm_head(x)), "layer 0 ms", parts)
