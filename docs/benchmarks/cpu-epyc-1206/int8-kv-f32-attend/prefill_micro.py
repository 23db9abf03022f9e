"""One layer's attention over an int8 CPU cache for a prefill chunk of CTX tokens (SmolLM2
shapes, query tiles of 128 as the engine runs them): the context dequantised and rounded to
bf16 then SDPA in bf16 (the engine's prefill path), against SDPA on the float32 values; µs.

    PYTHONPATH=. python docs/benchmarks/cpu-epyc-1206/int8-kv-f32-attend/prefill_micro.py
"""
import time, torch, torch.nn.functional as F
from backend.layers.attention import causal_chunk_mask
torch.manual_seed(0)
kvh, g, hd, slots_total = 3, 3, 64, 40000
def t(fn, n=30):
    for _ in range(3): fn()
    t0=time.perf_counter()
    for _ in range(n): fn()
    return (time.perf_counter()-t0)/n*1e6
data = torch.randint(-127, 128, (slots_total, 2, kvh, hd), dtype=torch.int8)
sc = torch.rand(slots_total, 2, kvh) * 0.05
for ctx in (128, 512, 1024):
    idx = torch.randperm(slots_total)[:ctx]
    q = torch.randn(ctx, kvh * g, hd).bfloat16()
    tile = 128
    def run(dt):
        kv = data.index_select(0, idx).float().mul_(sc.index_select(0, idx).unsqueeze(-1)).to(dt)
        k = kv[:, 0].transpose(0, 1).unsqueeze(0); v = kv[:, 1].transpose(0, 1).unsqueeze(0)
        qq = q.to(dt); outs = []
        for p0 in range(0, ctx, tile):
            m = min(tile, ctx - p0); end = p0 + m
            mask = causal_chunk_mask(p0, m, g, q.device, dt)
            qg = qq[p0:end].view(m, kvh, g, hd).permute(1, 2, 0, 3).reshape(1, kvh, g * m, hd)
            outs.append(F.scaled_dot_product_attention(qg, k[:, :, :end], v[:, :, :end], attn_mask=mask, scale=hd ** -0.5))
        return outs
    print(ctx, {"bf16": round(t(lambda: run(torch.bfloat16))), "f32": round(t(lambda: run(torch.float32)))})
