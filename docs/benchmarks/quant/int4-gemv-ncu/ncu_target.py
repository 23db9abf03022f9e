"""The target ncu profiles: each Llama-2-7B linear shape at one token through the int4 g128
word-wise GEMV (the committed tile), then the bf16 GEMV (``gemv.gemv``) on the same shapes.
Warm-up calls first (Triton compiles); the calls ncu keeps are the last of each kind.

    ncu ... python ncu_target.py
"""
import torch

from backend.layers import gemv
from backend.layers import quant_kernels as qk
from backend.layers.quantize import quantize_int4
from benchmarks.quant_sweep import SHAPES_7B

dev = torch.device("cuda")
G = 128
for name, N, K in SHAPES_7B:
    gen = torch.Generator(device=dev).manual_seed(0)
    w = torch.randn(N, K, device=dev, generator=gen) * 0.02
    g = quantize_int4(w, G)
    packed = qk.pack_int4(g.codes)
    sm = qk.pack_scale_min(g.scale.to(torch.bfloat16), g.min.to(torch.bfloat16))
    x = torch.randn(1, K, device=dev, generator=gen).to(torch.bfloat16)
    wb = w.to(torch.bfloat16)
    for _ in range(3):
        qk.int4_matmul(x, packed, sm, G)
        gemv.gemv(x, wb)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(name)
    qk.int4_matmul(x, packed, sm, G)
    gemv.gemv(x, wb)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print(name, N, K, flush=True)
