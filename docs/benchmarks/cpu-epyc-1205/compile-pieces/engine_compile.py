"""The engine with --compile on the CPU (SmolLM2, its defaults otherwise): start-up, one
greedy request with a 40-token prompt, batch-1 decode step (48 steps, twice), with the
dense prefill copies as given (auto / off); "eager": the same without --compile (copies
auto). Output: engine-compile-<mode>.txt.

    python docs/benchmarks/cpu-epyc-1205/compile-pieces/engine_compile.py auto|off|eager
"""
import os, sys, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from copy_ab import decode_ms
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.weights.loader import load_model_source
mode = sys.argv[1]
t = time.perf_counter()
eng = LLMEngine(EngineConfig(kv_cache_memory_gib=0.5, max_model_len=1024, max_num_seqs=64,
                             enable_prefix_caching=False, compile=mode != "eager",
                             prefill_dense_weights="auto" if mode == "eager" else mode),
                load_model_source("smollm2-135m-instruct"))
print("start s", round(time.perf_counter() - t, 1), eng.stats().compile, flush=True)
out = eng.generate([list(range(300, 340))], SamplingParams(max_tokens=4, temperature=0))
print("generate ok", out)
for r in range(2):
    print("b1", round(decode_ms(eng, 1, steps=48), 2), flush=True)
