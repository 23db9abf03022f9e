# Trial of the LM head through fbgemm's dynamic int8 linear (CPU). Output: results.txt.
import torch, time, warnings
warnings.filterwarnings("ignore")
torch.set_grad_enabled(False)
flush = torch.empty(64 * 2**20, dtype=torch.uint8); f2 = torch.empty_like(flush)
def tm(f, n=30):
    for _ in range(3): f()
    tot = 0
    for _ in range(n):
        f2.copy_(flush)
        t=time.perf_counter(); f(); tot += time.perf_counter()-t
    return tot/n*1e3
for (N, K, name) in ((49152, 576, "head"), (3072, 576, "gate_up"), (576, 1536, "down")):
    w = torch.randn(N, K) * 0.02
    s = w.abs().amax(1) / 127; q = (w / s[:, None]).round().clamp(-127, 127).to(torch.int8)
    pk = torch.ops.quantized.linear_prepack(torch._make_per_channel_quantized_tensor(q, s.double(), torch.zeros(N, dtype=torch.long), 0), None)
    G = 32; g = w.view(N, K // G, G); lo = g.amin(-1); sc = (g.amax(-1) - lo).clamp(min=1e-8) / 15
    codes = ((g - lo[..., None]) / sc[..., None]).round().clamp(0, 15).to(torch.int32).view(N, K)
    p4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    sz = torch.stack([sc, lo + 8 * sc], -1).transpose(0, 1).contiguous().to(torch.bfloat16)
    for M in (1, 8, 32):
        x = torch.randn(M, K, dtype=torch.bfloat16); xf = x.float()
        print(name, M, "int8pack %.3f" % tm(lambda: torch._weight_int8pack_mm(x, q, s.to(torch.bfloat16))),
              "int4 %.3f" % tm(lambda: torch._weight_int4pack_mm_for_cpu(x, p4, G, sz)),
              "fbgemm-dyn %.3f" % tm(lambda: torch.ops.quantized.linear_dynamic(xf, pk, False)))
