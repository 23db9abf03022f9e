"""torch.profiler over 10 decode steps of the CPU engine (SmolLM2, defaults otherwise) at
batch 4 after 128-token prompts, with the KV cache given: ``auto`` (bf16), ``int8`` (V in
rows, now) or ``int8-transposed`` (the tree before: ``ab.use_before``).

    PYTHONPATH=. python docs/benchmarks/cpu-epyc-1206/int8-kv-rows/profile_step.py KIND
"""
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.weights.loader import load_model_source
from ab import use_before  # this folder's A/B script (the script's folder is on sys.path)

kind = sys.argv[1]
eng = LLMEngine(EngineConfig(device="cpu", kv_cache_dtype=kind.removesuffix("-transposed"),
                             enable_prefix_caching=False, max_model_len=1024),
                load_model_source("smollm2-135m-instruct"))
if kind.endswith("-transposed"):
    use_before(eng)
g = torch.Generator().manual_seed(0)
for i in range(4):
    eng.add_request(f"r{i}", torch.randint(100, 40000, (128,), generator=g).tolist(),
                    SamplingParams(max_tokens=200, ignore_eos=True, temperature=0.0))
for _ in range(12):
    eng.step()
t0 = time.perf_counter()
for _ in range(20):
    eng.step()
print(kind, "step", round((time.perf_counter() - t0) / 20 * 1e3, 2), "ms")
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(10):
        eng.step()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
