"""A/B in one process: SmolLM2 on the CPU with its defaults, a prompt's attention in query
tiles of attention.CPU_PREFILL_Q_TILE positions ("tiles") against one SDPA call per chunk
("one call", as before), alternating round by round: time to the first token of 256-, 512-
and 1,000-token prompts (no prefix cache)."""
import json
import os
import statistics
import sys
import time

import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.layers import attention
from backend.weights.loader import load_model_source

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 4
TILE = attention.CPU_PREFILL_Q_TILE
eng = LLMEngine(EngineConfig(kv_cache_memory_gib=0.5, max_model_len=2048,
                             enable_prefix_caching=False), load_model_source("smollm2-135m-instruct"))
out = {"load_start": os.getloadavg(), "tile": TILE,
       "max_num_batched_tokens": eng.config.max_num_batched_tokens, "samples": {}}


def first_token_ms(n, seed):
    p = torch.randint(100, 40000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    t = time.perf_counter()
    eng.generate([p], SamplingParams(max_tokens=1, temperature=0))
    return (time.perf_counter() - t) * 1e3


first_token_ms(512, 0)  # warm-up
for r in range(ROUNDS):
    for name in (("one call", "tiles") if r % 2 == 0 else ("tiles", "one call")):
        attention.CPU_PREFILL_Q_TILE = TILE if name == "tiles" else 1 << 30
        s = out["samples"].setdefault(name, {})
        for n in (256, 512, 1000):
            s.setdefault(f"first_token_ms_{n}", []).append(round(first_token_ms(n, r), 1))
attention.CPU_PREFILL_Q_TILE = TILE
out["medians"] = {name: {k: statistics.median(v) for k, v in s.items()}
                  for name, s in out["samples"].items()}
out["load_end"] = os.getloadavg()
print(json.dumps(out))
