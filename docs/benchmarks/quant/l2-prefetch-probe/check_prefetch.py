"""Ad hoc: PREFETCH variants give the same bits, and per-layer time after a one-program kernel."""
import torch, json
from backend.layers import quant_kernels as qk
from backend.layers.quantize import quantize_int4
from benchmarks.quant import graph_time_us
torch.manual_seed(0)
dev = "cuda"
base = qk.CONFIGS["int4-g128"][1]
res = {}
for name, (N, K) in dict(qkv=(12288, 4096), o=(4096, 4096), gate_up=(22016, 4096), down=(4096, 11008)).items():
    w = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
    g = quantize_int4(w, 128)
    packed = qk.pack_int4(g.codes)
    x = torch.randn(1, K, device=dev, dtype=torch.bfloat16)
    ys = {}
    for pf in (0, 1, 2):
        cfg = dict(base, PREFETCH=pf)
        ys[pf] = qk.int4_matmul(x, packed, g.scale, g.min, 128, cfg)
        torch.cuda.synchronize()
    same = [bool(torch.equal(ys[0], ys[p])) for p in (1, 2)]
    # time: a copy of 64 MB (evicts L2) then a small elementwise kernel, then the GEMV
    junk = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
    xs = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
    t = {}
    for pf in (0, 1, 2, 0, 1, 2):
        cfg = dict(base, PREFETCH=pf)
        def f():
            junk.add_(1)
            qk.int4_matmul(x, packed, g.scale, g.min, 128, cfg)
        def f0():
            junk.add_(1)
        t.setdefault(pf, []).append(graph_time_us(f) - graph_time_us(f0))
    res[name] = dict(same=same, us={p: [round(v, 2) for v in vs] for p, vs in t.items()})
    print(name, res[name], flush=True)

# decode attention: the same bits with the prefetch
from backend.layers import triton_attention as ta
torch.manual_seed(1)
B, H, hd, bs, nblk = 1, 32, 128, 16, 64
cache = torch.randn(nblk * bs, 2, H, hd, device=dev, dtype=torch.bfloat16)
q = torch.randn(B, H, hd, device=dev, dtype=torch.bfloat16)
bt = torch.randperm(nblk, device=dev, dtype=torch.int32)[None, :40]
ctx = torch.tensor([600], device=dev, dtype=torch.int32)
outs = []
for pf in (False, True):
    ta.DECODE_PREFETCH = pf
    out = torch.empty_like(q)
    ta.paged_decode(q, cache, None, bt, ctx, out, hd ** -0.5, bs, "auto", 16, dependent_launch=True)
    torch.cuda.synchronize()
    outs.append(out)
print("attention same bits:", bool(torch.equal(outs[0], outs[1])), flush=True)
