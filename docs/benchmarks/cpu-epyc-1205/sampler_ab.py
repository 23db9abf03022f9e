"""A/B in one process: random sampling (temperature 1) on the CPU through the inverse CDF
(one uniform per row, "cdf") against the exponential race the CPU ran before ("race": a
uniform per token turned into Exp(1) by -log1p(-U), then argmax(p / E)), alternating round by
round. The draw alone on [N, 49152] logits, and the SmolLM2 engine's decode step (defaults,
16-token prompts, 24 steps) at batch 1 / 8 / 32."""
import json
import os
import statistics
import sys
import time

import torch

from backend.engine import sampler as sampler_module
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.weights.loader import load_model_source
from copy_ab import decode_ms  # this folder

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 4
CDF = sampler_module.inverse_cdf


def race_cpu(probs, generators, shared):
    """The CPU draw before: Exp(1) noise from uniforms, as the sampler made it."""
    noise = torch.empty_like(probs).uniform_(generator=shared).neg_().log1p_().neg_()
    for i, gen in enumerate(generators):
        if gen is not None:
            noise[i].uniform_(generator=gen).neg_().log1p_().neg_()
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)
    return (probs / noise).argmax(dim=-1)


DRAWS = {"race": race_cpu, "cdf": CDF}
eng = LLMEngine(EngineConfig(kv_cache_memory_gib=0.5, max_model_len=1024, max_num_seqs=64,
                             enable_prefix_caching=False), load_model_source("smollm2-135m-instruct"))
V = eng.runner.model.cfg.vocab_size
out = {"load_start": os.getloadavg(), "vocab": V, "samples": {}}


def draw_ms(n, draw, reps=50):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(n, V, generator=g) * 3
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        draw(torch.softmax(logits, dim=-1), [None] * n, g)
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


decode_ms(eng, 8, 4)  # warm-up
for r in range(ROUNDS):
    for name in (("race", "cdf") if r % 2 == 0 else ("cdf", "race")):
        sampler_module.inverse_cdf = DRAWS[name]
        s = out["samples"].setdefault(name, {})
        for n in (1, 8, 32):
            s.setdefault(f"draw_ms_{n}x{V}", []).append(round(draw_ms(n, DRAWS[name]), 3))
        for b in (1, 8, 32):
            s.setdefault(f"step_ms_batch{b}", []).append(round(decode_ms(eng, b, temperature=1.0), 2))
sampler_module.inverse_cdf = CDF
out["medians"] = {name: {k: statistics.median(v) for k, v in s.items()}
                  for name, s in out["samples"].items()}
out["load_end"] = os.getloadavg()
print(json.dumps(out))
