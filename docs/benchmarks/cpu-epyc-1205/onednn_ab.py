"""A/B in one process: the CPU engine with its defaults (SmolLM2's Q4_1 codes as int4, the
Q8_0 head as int8, dense copies kept) with the bf16 copies reordered once for oneDNN and
used from their thresholds ("onednn") or kept in the plain layout with the plain thresholds
("plain": the tree before), alternating round by round; the copies are rebuilt at each
switch. Decode step time at batch 1 / 4 / 8 / 16 / 32 / 64 (16-token prompts) and the time
to the first token of 100- and 512-token prompts.

    python docs/benchmarks/cpu-epyc-1205/onednn_ab.py [ROUNDS] > OUT.json
"""
import os
import sys
import time

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.layers import cpu_dequant
from backend.layers.linear import keep_prefill_dense
from backend.weights.loader import load_model_source

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from copy_ab import decode_ms, finish, sample  # noqa: E402

REORDER = cpu_dequant.onednn_weight


def use(model, onednn: bool) -> None:
    keep_prefill_dense(model.modules(), "off", 0)
    cpu_dequant.onednn_weight = REORDER if onednn else (lambda w: None)
    keep_prefill_dense(model.modules(), "on", 0)


def first_token_ms(eng, n):
    t = time.perf_counter()
    eng.generate([[(7 * i) % 40000 + 300 for i in range(n)]], SamplingParams(max_tokens=1))
    return (time.perf_counter() - t) * 1e3


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    eng = LLMEngine(EngineConfig(kv_cache_memory_gib=0.5, max_model_len=1024, max_num_seqs=64,
                                 enable_prefix_caching=False),
                    load_model_source("smollm2-135m-instruct"))
    model = eng.runner.model
    st = eng.stats()
    out = {"load_start": os.getloadavg(), "weights": st.weights_format,
           "kernel": st.linear_kernel, "lm_head": st.lm_head_format,
           "copy_min_rows": cpu_dequant.COPY_MIN_ROWS,
           "head_copy_min_rows": cpu_dequant.HEAD_COPY_MIN_ROWS, "samples": {}}
    decode_ms(eng, 8, 4)  # warm-up
    for r in range(rounds):
        for name in ("plain", "onednn") if r % 2 == 0 else ("onednn", "plain"):
            use(model, name == "onednn")
            assert model.lm_head.prefill_weight.is_mkldnn == (name == "onednn")
            decode_ms(eng, 4, 2)  # the new copies' first touch
            s = out["samples"].setdefault(name, {})
            sample(eng, s, (1, 4, 8, 16, 32, 64), (100, 512), first_token_ms)
            print(name, {k: v[-1] for k, v in s.items()}, file=sys.stderr, flush=True)
    finish(out)


if __name__ == "__main__":
    main()
