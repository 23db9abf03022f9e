"""Quantised weights with and without dense copies on CUDA (``--prefill-dense-weights``),
against bf16 weights, one process, engines built one after the other in an alternating
order: TTFT of a 512-token prompt (median of 5) and the decode step (median, every sequence
decoding, contexts of 512 prompt tokens and up) at each batch size. Synthetic Llama-2-7B.

    python docs/benchmarks/quant/gpu-copies/drive.py OUT.json
"""
import gc
import json
import sys
import time

import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.weights.loader import synthetic_source
from benchmarks.attention import _decode_ms, _outlasting_prefill, _prompts, _ttft_ms

ALL = (1, 16, 32, 64, 128)
# (weights, copies, LM head, batches)
ORDER = [("bf16", "off", "model", ALL), ("int4", "off", "model", ALL),
         ("int4", "on", "model", ALL), ("int4", "on", "model", ALL),
         ("int4", "off", "model", ALL), ("bf16", "off", "model", ALL),
         ("int4", "on", "int8", (1, 64, 128)), ("int8", "off", "model", (1, 64, 128)),
         ("int8", "on", "model", (1, 64, 128))]
PROMPT, STEPS, MAX_LEN, GROUP = 512, 24, 640, 128


def run(weights: str, copies: str, head: str, batches: tuple[int, ...],
        device: str = "cuda", preset: str = "llama-2-7b", kv_gib: float = 42) -> dict:
    t0 = time.perf_counter()
    engine = LLMEngine(EngineConfig(device=device, dtype="bfloat16", weights_dtype=weights,
                                    int4_group_size=GROUP, prefill_dense_weights=copies,
                                    lm_head_dtype=head, max_model_len=MAX_LEN,
                                    max_num_seqs=max(batches), kv_cache_memory_gib=kv_gib,
                                    enable_prefix_caching=False),
                       synthetic_source(preset))
    st = engine.stats()
    row = {"weights": st.weights_format, "copies": copies, "head": st.lm_head_format,
           "prefill_kernel": st.prefill_kernel,
           "copies_gib": round(st.prefill_dense_weights["bytes"] / 2**30, 2),
           "build_s": round(time.perf_counter() - t0, 1),
           "gpu_mem_gib": round(torch.cuda.memory_allocated() / 2**30, 2)
           if device == "cuda" else None}
    engine.generate(_prompts(2, PROMPT, 90), SamplingParams(max_tokens=4, temperature=0.0,
                                                            ignore_eos=True))
    ttft, all_ms = _ttft_ms(engine)
    row["ttft_512_ms"], row["ttft_512_all_ms"] = round(ttft, 3), [round(t, 3) for t in all_ms]
    for b in batches:
        out = _outlasting_prefill(b, PROMPT, STEPS, 1024)
        row[f"step_ms_b{b}"] = round(_decode_ms(engine, b, PROMPT, out, b), 3)
    row["utc"] = time.strftime("%H:%M:%S", time.gmtime())
    del engine
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def main(path: str) -> None:
    rows = []
    for cfg in ORDER:
        r = run(*cfg)
        rows.append(r)
        print(json.dumps(r), flush=True)
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "prompt_tokens": PROMPT, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
