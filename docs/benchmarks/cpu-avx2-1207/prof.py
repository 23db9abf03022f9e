"""ms a decode step at a ~550-token context (one request), then the profiler's top ops.
    PYTHONPATH=. python docs/benchmarks/cpu-avx2-1207/prof.py"""
import time

from torch.profiler import ProfilerActivity, profile

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.weights.loader import load_model_source

e = LLMEngine(EngineConfig(max_model_len=1024, kv_cache_memory_gib=0.1),
              load_model_source("smollm2-135m-instruct"))
s = e.stats()
print(s.weights_format, s.lm_head_kernel, s.attention_kernel)
e.add_request("a", list(range(1000, 1512)),
              SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True))
for _ in range(20):
    e.step()
t = time.perf_counter()
for _ in range(20):
    e.step()
print("ms/step", (time.perf_counter() - t) / 20 * 1e3)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(10):
        e.step()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22))
