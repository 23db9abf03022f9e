"""(Runs against the tree before the scale records, commit 07c865c:
``int4_matmul(x, packed, scale, lo, G)``; see call3.sh.)
CPU check of the records GEMV under TRITON_INTERPRET=1 against the dequantised reference."""
import torch
from backend.layers import quant_kernels as qk
from backend.layers.quantize import quantize_int4
import rec_kernel as rk

torch.manual_seed(0)
for N, K, split_pps in ((64, 512, 0), (48, 768, 4), (128, 1024, 8)):
    w = torch.randn(N, K) * 0.02
    g = quantize_int4(w, 128)
    packed = qk.pack_int4(g.codes)
    scale, lo = g.scale.to(torch.bfloat16), g.min.to(torch.bfloat16)
    ref = qk.dequantize_int4(packed, scale, lo, 128).float()
    sz = rk.records(scale, lo)
    x = torch.randn(1, K).to(torch.bfloat16)
    r = x.float() @ ref.T
    for xw in (0, 1):
        for bn in (16, 32):
            cfg = dict(BLOCK_N=bn, GROUPS=1, STAGES=1, PROGRAMS_PER_SM=split_pps, num_warps=2, num_stages=3, XW=xw)
            y = rk.int4_gemv_rec(x, packed, sz, 128, cfg, 1, dict(PDL=False))
            e = ((y.float() - r).abs().max() / r.abs().max()).item()
            print(N, K, xw, bn, f"{e:.2e}")
            assert e < 1e-2
