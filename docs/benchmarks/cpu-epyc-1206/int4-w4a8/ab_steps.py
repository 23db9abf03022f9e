"""Step-by-step A/B in one process: the CPU engine (SmolLM2, the CPU defaults: the file's Q4_1
codes as int4) with the int4 layers' few-row calls through torch's int4 kernel ("model") or
the int4 x int8 op in one or two int8 parts ("int8", "int8x2"), three engines each on its own
copy of the model, each holding ``batch`` sequences in decode (PROMPT-token prompts, their
prefills done first). Then STEPS rounds of one decode step per engine, the order rotated
every round, each step timed alone: every round compares the three at the same context
length and the same moment of the machine's load. Per batch and engine: the median step, and
in how many rounds each op engine beat "model".

    PYTHONPATH=. python docs/benchmarks/cpu-epyc-1206/int4-w4a8/ab_steps.py \
        [STEPS] [BATCHES] [PROMPT]
"""
import json
import os
import statistics
import sys

from common import into_decode, paired_steps

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.weights.loader import load_model_source


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    batches = [int(b) for b in (sys.argv[2] if len(sys.argv) > 2 else "1,2,4,8").split(",")]
    prompt = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    src = load_model_source("smollm2-135m-instruct")
    cfg = dict(kv_cache_memory_gib=0.5, max_model_len=1024, max_num_seqs=64,
               enable_prefix_caching=False, cpu_aot_kernels="build")
    names = ("model", "int8", "int8x2")
    engines = {a: LLMEngine(EngineConfig(cpu_int4_activations=a, **cfg), src) for a in names}
    for name, eng in engines.items():
        k = eng.runner.aot_kernels
        assert (k.int4_w4a8["status"] == "off") == (name == "model"), k.int4_w4a8
        assert k.layers["status"] in ("loaded", "built"), k.layers
        assert k.few_rows_layers["status"] in ("loaded", "built"), k.few_rows_layers
    out = {"load_start": os.getloadavg(), "prompt_tokens": prompt, "steps": steps,
           "batches": {}}
    params = SamplingParams(max_tokens=steps + 8, ignore_eos=True, temperature=0)
    for b in batches:
        for n, eng in engines.items():
            into_decode(eng, n, b, prompt, params)
        times = paired_steps(engines, steps)
        row = {n: {"median_ms": round(statistics.median(t), 3)} for n, t in times.items()}
        for n in ("int8", "int8x2"):
            row[n]["faster_rounds"] = sum(a < m for a, m in zip(times[n], times["model"]))
        out["batches"][b] = row
        print(b, row, file=sys.stderr, flush=True)
    out["load_end"] = os.getloadavg()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
