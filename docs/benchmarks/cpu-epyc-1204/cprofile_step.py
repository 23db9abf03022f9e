import cProfile, pstats, time
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.weights.loader import load_model_source
src = load_model_source("smollm2-135m-instruct")
eng = LLMEngine(EngineConfig(kv_cache_memory_gib=0.25, max_model_len=1024, enable_prefix_caching=False), src)
eng.add_request("a", list(range(100, 116)), SamplingParams(max_tokens=300, ignore_eos=True))
for _ in range(20): eng.step()
t=time.perf_counter()
for _ in range(100): eng.step()
print("ms/step", (time.perf_counter()-t)/100*1e3, eng.stats().lm_head_format)
pr = cProfile.Profile(); pr.enable()
for _ in range(100): eng.step()
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(25)
