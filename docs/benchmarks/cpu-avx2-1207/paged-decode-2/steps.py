"""Decode steps of SmolLM2 with the engine's defaults, engines side by side in one process,
alternating request by request: each variant a request of a 512-token prompt, 4 steps to
warm, then 50 decode steps timed (contexts 517-566), ROUNDS times.
    PYTHONPATH=. python docs/benchmarks/cpu-avx2-1207/paged-decode-2/steps.py ROUNDS \\
        "lib=OLD.so" "" "lm_head_dtype=int4"
A variant: comma-separated EngineConfig fields (key=value), lib=PATH for another build
of the paged decode kernel, and int8_rows=off for the LM head auto chose before the int8
rows kernel (fp16 through fbgemm on an AVX2 CPU). Prints one JSON line per variant (ms a
step, each round)."""
import json
import sys
import time

from backend.engine import aot_kernels
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.layers.cpu_paged_decode import PagedDecode
from backend.weights.loader import load_model_source


def make(source, spec: str) -> LLMEngine:
    fields = dict(x.split("=", 1) for x in spec.split(",")) if spec else {}
    lib = fields.pop("lib", None)
    ready = aot_kernels.int8_rows_ready
    if fields.pop("int8_rows", None) == "off":
        aot_kernels.int8_rows_ready = lambda mode, dtype: False
    try:
        engine = LLMEngine(EngineConfig(max_model_len=2048, kv_cache_memory_gib=0.1,
                                        **fields), source)
    finally:
        aot_kernels.int8_rows_ready = ready
    if lib:
        engine.runner.attn.cpu_decode = PagedDecode(lib)
    return engine


def main() -> None:
    rounds, specs = int(sys.argv[1]), sys.argv[2:]
    source = load_model_source("smollm2-135m-instruct")
    engines = [make(source, s) for s in specs]
    ms = [[] for _ in specs]
    for r in range(rounds):
        for i, e in enumerate(engines):
            e.add_request(f"r{r}", list(range(1000, 1512)),
                          SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True))
            times = [time.perf_counter() for _ in range(54) if e.step() is not None]
            ms[i].append(round((times[53] - times[3]) / 50 * 1e3, 2))  # after 4 to warm
            while e.has_unfinished():
                e.step()
    for spec, e, m in zip(specs, engines, ms):
        s = e.stats()
        print(json.dumps({"variant": spec or "defaults", "ms_per_step": m,
                          "median": sorted(m)[len(m) // 2], "weights": s.weights_format,
                          "lm_head_kernel": s.lm_head_kernel,
                          "attention": s.attention_kernel}), flush=True)


if __name__ == "__main__":
    main()
