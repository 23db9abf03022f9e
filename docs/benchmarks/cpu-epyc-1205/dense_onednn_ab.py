"""A/B in one process: SmolLM2 served with bf16 weights (``--weights-dtype bf16``) with its
linear layers' copies reordered for oneDNN (``--prefill-dense-weights`` on: "onednn") or
without them (off: plain bf16 weights, the tree before), alternating round by round. Decode
step time at batch 1 / 8 / 32 (16-token prompts) and the time to the first token of 100- and
512-token prompts.

    python docs/benchmarks/cpu-epyc-1205/dense_onednn_ab.py [ROUNDS] > OUT.json
"""
import os
import sys

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.layers.linear import keep_prefill_dense
from backend.weights.loader import load_model_source

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from copy_ab import alternate, decode_ms, finish  # noqa: E402
from onednn_ab import first_token_ms  # noqa: E402


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    eng = LLMEngine(EngineConfig(weights_dtype="bf16", kv_cache_memory_gib=0.5,
                                 max_model_len=1024, max_num_seqs=64,
                                 enable_prefix_caching=False),
                    load_model_source("smollm2-135m-instruct"))
    model = eng.runner.model
    st = eng.stats()
    out = {"load_start": os.getloadavg(), "weights": st.weights_format,
           "kernel": st.linear_kernel, "copies": st.prefill_dense_weights, "samples": {}}
    decode_ms(eng, 8, 4)  # warm-up

    def switch(name):
        keep_prefill_dense(model.modules(), "on" if name == "onednn" else "off", 0)
        assert model.layers[0].qkv.kernel == ("dense-onednn" if name == "onednn" else "dense")
        decode_ms(eng, 4, 2)

    alternate(eng, out, ("plain", "onednn"), switch, rounds, first_token=first_token_ms)
    finish(out)


if __name__ == "__main__":
    main()
