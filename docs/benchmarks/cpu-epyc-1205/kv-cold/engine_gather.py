"""Ad hoc: the decode step of the embedded SmolLM2 (CPU defaults, one greedy request, ~240-300
token context) with KVCache.gather timed in place: per call and per step."""
import time, torch
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.weights.loader import load_model_source
from backend.layers import kv_cache
acc = [0.0, 0]
orig = kv_cache.KVCache.gather
def timed(self, layer, idx):
    t = time.perf_counter(); r = orig(self, layer, idx); acc[0] += time.perf_counter() - t; acc[1] += 1; return r
kv_cache.KVCache.gather = timed
src = load_model_source("smollm2-135m-instruct")
e = LLMEngine(EngineConfig(device="cpu"), src)
print("cache", tuple(e.runner.kv_cache.data.shape), e.runner.kv_cache.data.dtype, "v_transposed", e.runner.kv_cache.v_transposed)
p = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
e.add_request("a", list(range(100, 300)), p)
for _ in range(40):
    e.step()
acc[:] = [0.0, 0]
ts = []
for _ in range(60):
    t = time.perf_counter(); e.step(); ts.append(time.perf_counter() - t)
ts.sort(); print("step median ms %.2f; gather per call %.1f us (%d calls), per step %.2f ms" % (ts[30] * 1e3, acc[0] / acc[1] * 1e6, acc[1], acc[0] / 60 * 1e3))
