"""What ``--prefill-dense-weights auto`` picks for a synthetic Llama-2-7B with int4 g128
weights on this GPU (the budget by device), and the time to the first token of a 512-token
prompt with that choice and with ``off`` (median of 5, one engine after the other).

    python docs/benchmarks/gpu-sweep/exact-prompts/quant-weights/auto_check.py
"""
import gc
import json
import statistics
import time

import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.weights.loader import load_model_source

src = load_model_source("synthetic:llama-2-7b")
out = {"gpu": torch.cuda.get_device_name(),
       "total_gib": torch.cuda.get_device_properties(0).total_memory / 2**30}
for mode in ("auto", "off"):
    eng = LLMEngine(EngineConfig(device="cuda", weights_dtype="int4", int4_group_size=128,
                                 prefill_dense_weights=mode, kv_cache_memory_gib=8,
                                 max_model_len=1024, enable_prefix_caching=False), src)
    g = torch.Generator().manual_seed(0)
    ttft = []
    for i in range(6):
        prompt = torch.randint(3, 32000, (512,), generator=g).tolist()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        eng.add_request(f"{mode}{i}", prompt, SamplingParams(max_tokens=1, ignore_eos=True))
        while eng.has_unfinished():
            eng.step()
        torch.cuda.synchronize()
        ttft.append((time.perf_counter() - t0) * 1e3)
    st = eng.stats()
    out[mode] = {"prefill_dense_weights": st.prefill_dense_weights,
                 "prefill_kernel": st.prefill_kernel,
                 "ttft_512_ms_median_of_5": statistics.median(ttft[1:]), "ttft_ms": ttft}
    del eng
    gc.collect()
    torch.cuda.empty_cache()
print(json.dumps(out, indent=1))
