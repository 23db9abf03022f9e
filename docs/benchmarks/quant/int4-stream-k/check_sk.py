"""Ad hoc, CUDA: stream-K int4 GEMM against the tile grid and the dequantised reference
(bf16 and fp32 x), Llama shapes and odd ones; repeated calls bit-identical; counters zero."""
import torch
from backend.layers import quant_kernels as qk, splits
from backend.layers.quantize import quantize_int4
torch.manual_seed(0)
dp = dict(BLOCK_N=64, GROUPS=1, SPLIT_K=0, MAGIC=3, SWAP=1, SPLIT_TARGET=1, num_warps=4, num_stages=3)
for N, K, G, M, dt in ((12288, 4096, 128, 64, torch.bfloat16), (22016, 4096, 128, 64, torch.bfloat16),
                       (500, 1024, 32, 20, torch.float32), (500, 1024, 32, 130, torch.float32),
                       (4096, 11008, 128, 48, torch.bfloat16)):
    w = torch.randn(N, K, device="cuda") * 0.02
    g = quantize_int4(w, G)
    packed = qk.pack_int4(g.codes)
    scale, lo = g.scale.to(dt), g.min.to(dt)
    ref = qk.dequantize_int4(packed, scale, lo, G).float()
    x = torch.randn(M, K, device="cuda").to(dt)
    want = x.float() @ ref.t()
    sk = dict(dp, STREAM_K=2, STREAM_K_FROM=0)
    a = qk.int4_matmul(x, packed, scale, lo, G, dp).float()
    outs = [qk.int4_matmul(x, packed, scale, lo, G, sk) for _ in range(20)]
    torch.cuda.synchronize()
    same = all(torch.equal(outs[0], o) for o in outs)
    b = outs[0].float()
    rel = lambda u: ((u - want).abs().max() / want.abs().max()).item()
    print(N, K, G, M, dt, "grid rel", f"{rel(a):.2e}", "stream rel", f"{rel(b):.2e}",
          "stream vs grid", f"{((a-b).abs().max()/a.abs().max()).item():.2e}", "same bits x20", same,
          "counters", int(splits.counters(x.device).abs().sum()), flush=True)
