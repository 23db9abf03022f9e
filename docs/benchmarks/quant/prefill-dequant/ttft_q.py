"""Ad hoc: TTFT of a 512-token prompt (median of 5, benchmarks.attention._ttft_ms) and the
batch-1 decode step, synthetic Llama-2-7B, argv[1] = weights dtype, argv[2] = "new" (the
one-pass Triton dequantiser for prefill) or "torch" (the torch expressions, as before)."""
import json, sys, time
import torch
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.layers import gpu_dequant
from backend.weights.loader import load_model_source
from benchmarks.attention import _decode_ms, _prompts, _ttft_ms
wd, mode = sys.argv[1], sys.argv[2]
if mode == "torch":
    gpu_dequant._kernels = lambda device: False
src = load_model_source("synthetic:llama-2-7b")
t0 = time.perf_counter()
eng = LLMEngine(EngineConfig(device="cuda", dtype="bfloat16", weights_dtype=wd,
                             int4_group_size=128, max_model_len=1024, max_num_seqs=64,
                             kv_cache_memory_gib=24, enable_prefix_caching=False), src)
build = time.perf_counter() - t0
warm = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
for n in (3, 1):
    eng.generate(_prompts(n, 512, 90 + n), warm)
ttft, all_ms = _ttft_ms(eng)
one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
first = eng.generate(_prompts(4, 512, 7), one)
print(json.dumps({"weights": wd, "prefill_dequant": mode, "build_s": round(build, 1),
                  "ttft_512_ms": round(ttft, 3), "ttft_512_all_ms": [round(t, 3) for t in all_ms],
                  "tpot_batch1_ms": round(_decode_ms(eng, 1, 512, 32, 1), 3),
                  "first_tokens_4x512": [o[:1] for o in first]}),
      flush=True)
