"""Ad hoc: SDPA for one decode query of SmolLM2 (9 query heads on 3 KV heads, 64 dims) in
the engine's layout (q [1, 3, 3, 64]) against enable_gqa (q [1, 9, 1, 64]) and the math
backend, strided and contiguous K/V, warm caches."""
import torch
import torch.nn.functional as F
from timing import bench
for C in (128, 270, 600):
    data = torch.randn(2000, 2, 3, 64, dtype=torch.bfloat16)
    idx = torch.randperm(2000)[:C].sort().values
    q = torch.randn(9, 64, dtype=torch.bfloat16)
    kv = data.index_select(0, idx).view(1, C, 2, 3, 64)
    k = kv[:, :, 0].transpose(1, 2); v = kv[:, :, 1].transpose(1, 2)
    f_cur = lambda: F.scaled_dot_product_attention(q.view(1, 3, 3, 64), k, v, scale=0.125)
    f_gqa = lambda: F.scaled_dot_product_attention(q.view(1, 9, 1, 64), k, v, scale=0.125, enable_gqa=True)
    kc, vc = k.contiguous(), v.contiguous()
    f_cur_c = lambda: F.scaled_dot_product_attention(q.view(1, 3, 3, 64), kc, vc, scale=0.125)
    f_gqa_c = lambda: F.scaled_dot_product_attention(q.view(1, 9, 1, 64), kc, vc, scale=0.125, enable_gqa=True)
    from torch.nn.attention import sdpa_kernel, SDPBackend
    def f_math():
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q.view(1, 3, 3, 64), k, v, scale=0.125)
    a = f_cur(); b = f_gqa().view(1, 3, 3, 64)
    print(C, "cur %.1f gqa %.1f cur-contig %.1f gqa-contig %.1f math %.1f" % (bench(f_cur), bench(f_gqa), bench(f_cur_c), bench(f_gqa_c), bench(f_math)), (a.float()-b.float()).abs().max().item())
