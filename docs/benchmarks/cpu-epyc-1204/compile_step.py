import sys, time, json
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.weights.loader import load_model_source
head, comp = sys.argv[1], sys.argv[2] == "1"
src = load_model_source("smollm2-135m-instruct")
t0 = time.perf_counter()
eng = LLMEngine(EngineConfig(weights_dtype="auto", lm_head_dtype=head, compile=comp or None,
                             kv_cache_memory_gib=0.25, max_model_len=1024,
                             enable_prefix_caching=False), src)
build = time.perf_counter() - t0
res = []
for r in range(5):
    eng.add_request(f"a{r}", list(range(100 + r, 116 + r)), SamplingParams(max_tokens=80, ignore_eos=True))
    for _ in range(3): eng.step()
    t = time.perf_counter()
    for _ in range(64): eng.step()
    res.append(64 / (time.perf_counter() - t))
    while eng.has_unfinished(): eng.step()
print(json.dumps({"head": head, "compile": comp, "build_s": round(build, 1), "tok_s": [round(x, 1) for x in res]}))
