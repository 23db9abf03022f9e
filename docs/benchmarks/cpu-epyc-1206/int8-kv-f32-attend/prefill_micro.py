"""One layer's attention over an int8 CPU cache for a prefill chunk of CTX tokens (SmolLM2
shapes, query tiles of 128 as the engine runs them): the context dequantised and rounded to
bf16 then SDPA in bf16 (the engine's prefill path), against SDPA on the float32 values; µs.

    PYTHONPATH=. python docs/benchmarks/cpu-epyc-1206/int8-kv-f32-attend/prefill_micro.py
"""
import time

import torch
import torch.nn.functional as F

from backend.layers.attention import causal_chunk_mask

torch.manual_seed(0)
KVH, G, HD, SLOTS, TILE = 3, 3, 64, 40000, 128


def timed(fn, n: int = 30) -> float:
    """µs per call of ``fn`` after 3 warm-up calls."""
    for _ in range(3):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


data = torch.randint(-127, 128, (SLOTS, 2, KVH, HD), dtype=torch.int8)
sc = torch.rand(SLOTS, 2, KVH) * 0.05
for ctx in (128, 512, 1024):
    idx = torch.randperm(SLOTS)[:ctx]
    q = torch.randn(ctx, KVH * G, HD).bfloat16()

    def run(dt: torch.dtype) -> list[torch.Tensor]:
        """The chunk's attention with the context dequantised into ``dt`` (query tiles)."""
        kv = data.index_select(0, idx).float().mul_(sc.index_select(0, idx).unsqueeze(-1)).to(dt)
        k = kv[:, 0].transpose(0, 1).unsqueeze(0)  # [1, kvh, ctx, hd]
        v = kv[:, 1].transpose(0, 1).unsqueeze(0)
        qq, outs = q.to(dt), []
        for p0 in range(0, ctx, TILE):
            m = min(TILE, ctx - p0)
            end = p0 + m
            mask = causal_chunk_mask(p0, m, G, q.device, dt)
            qg = qq[p0:end].view(m, KVH, G, HD).permute(1, 2, 0, 3).reshape(1, KVH, G * m, HD)
            outs.append(F.scaled_dot_product_attention(qg, k[:, :, :end], v[:, :, :end],
                                                       attn_mask=mask, scale=HD ** -0.5))
        return outs

    print(ctx, {"bf16": round(timed(lambda: run(torch.bfloat16))),
                "f32": round(timed(lambda: run(torch.float32)))})
