"""Step-by-step A/B in one process: the CPU engine with its defaults (SmolLM2, the Q4_1 codes
through the int4 x int8 op) with the int4 layers switching from the op to their dense copies
at NEW rows or at OLD rows (defaults 16, this tree's, and 9, before: the layer pieces are
compiled for 2 up to the row before the switch; from it the step runs eager on the copies),
two engines each on its own copy of the model, each holding ``batch`` sequences in decode;
then STEPS rounds of one step per engine, the order swapped every round. Each engine is this
tree with ``COPY_MIN_ROWS["int4-w4a8"]`` (and its plain copy's, at least as many) set to its
threshold while it is built (its pieces' row range), in its layers, and in its step's choice
of matmuls. Per batch: the median step of each (ms) and in how many rounds NEW was faster.

    PYTHONPATH=. python docs/benchmarks/cpu-epyc-1206/int4-w4a8/ab_copy_rows.py \
        [STEPS] [BATCHES] [PROMPT] [NEW] [OLD]
"""
import json
import os
import statistics
import sys

from common import into_decode, paired_steps

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.layers import cpu_dequant
from backend.layers.linear import Int4Linear
from backend.weights.loader import load_model_source

KEY = "int4-w4a8"
KEYS = (KEY, KEY + "-plain")  # the plain copy's threshold at least the same (few_rows_limit)


def engine_with(src, cfg, rows: int) -> LLMEngine:
    """This tree's engine with the op's copies from ``rows`` rows."""
    table = cpu_dequant.COPY_MIN_ROWS
    ours = {k: table[k] for k in KEYS}
    theirs = {KEY: rows, KEYS[1]: max(rows, ours[KEYS[1]])}
    table.update(theirs)
    try:
        eng = LLMEngine(EngineConfig(**cfg), src)  # pieces for 2 .. rows - 1
    finally:
        table.update(ours)
    own = dict(table, **theirs)
    for m in eng.runner.model.modules():
        if isinstance(m, Int4Linear) and m.copy_min_rows is table:
            m.copy_min_rows = own
    model = eng.runner.model
    matmuls = model._matmuls

    def own_matmuls(n):
        table.update(theirs)
        try:
            return matmuls(n)
        finally:
            table.update(ours)
    model._matmuls = own_matmuls
    return eng


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    batches = [int(b) for b in (sys.argv[2] if len(sys.argv) > 2 else "8,9,12,15,16").split(",")]
    prompt = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    new = sys.argv[4] if len(sys.argv) > 4 else str(cpu_dequant.COPY_MIN_ROWS[KEY])
    old = sys.argv[5] if len(sys.argv) > 5 else "9"
    src = load_model_source("smollm2-135m-instruct")
    cfg = dict(kv_cache_memory_gib=0.5, max_model_len=1024, max_num_seqs=64,
               enable_prefix_caching=False, cpu_aot_kernels="build")
    engines = {n: engine_with(src, cfg, int(n)) for n in (new, old)}
    rows = {n: e.runner.aot_kernels.few_rows_layers.get("rows") for n, e in engines.items()}
    assert rows == {n: [2, int(n) - 1] for n in engines}, rows
    out = {"load_start": os.getloadavg(), "prompt_tokens": prompt, "steps": steps,
           "piece_rows": rows, "batches": {}}
    params = SamplingParams(max_tokens=steps + 8, ignore_eos=True, temperature=0)
    for b in batches:
        for n, eng in engines.items():
            into_decode(eng, n, b, prompt, params)
        times = paired_steps(engines, steps)
        row = {n: round(statistics.median(t), 3) for n, t in times.items()}
        row["new_faster_rounds"] = sum(a < o for a, o in zip(times[new], times[old]))
        out["batches"][b] = row
        print(b, row, file=sys.stderr, flush=True)
    out["load_end"] = os.getloadavg()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
