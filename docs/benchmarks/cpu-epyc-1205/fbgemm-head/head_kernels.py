# Trial of the LM head through fbgemm's dynamic int8 linear (CPU). Output: results.txt.
import torch, time, warnings
warnings.filterwarnings("ignore")
torch.set_grad_enabled(False)
N, K = 49152, 576
w = torch.randn(N, K) * 0.02
x = torch.randn(1, K, dtype=torch.bfloat16)
flush = torch.empty(64 * 2**20, dtype=torch.uint8); f2 = torch.empty_like(flush)
def tm(f, n=50, cold=True):
    for _ in range(5): f()
    tot = 0
    for _ in range(n):
        if cold: f2.copy_(flush)
        t=time.perf_counter(); f(); tot += time.perf_counter()-t
    return tot/n*1e3
s = w.abs().amax(1) / 127; q = (w / s[:, None]).round().clamp(-127, 127).to(torch.int8)
sb = s.to(torch.bfloat16)
print("int8pack_mm cold", tm(lambda: torch._weight_int8pack_mm(x, q, sb)), "warm", tm(lambda: torch._weight_int8pack_mm(x, q, sb), cold=False))
qw = torch.quantize_per_channel(w, s, torch.zeros(N, dtype=torch.long), 0, torch.qint8)
packed = torch.ops.quantized.linear_prepack(qw, None)
xf = x.float()
print("fbgemm dyn cold", tm(lambda: torch.ops.quantized.linear_dynamic(xf, packed, True)), "warm", tm(lambda: torch.ops.quantized.linear_dynamic(xf, packed, True), cold=False))
qt = q.t()
def intmm():
    xs = x.float().abs().amax() / 127
    xq = (x.float() / xs).round().to(torch.int8)
    return torch._int_mm(xq, qt) * (s * xs)
try:
    print("_int_mm M=1 cold", tm(intmm), "warm", tm(intmm, cold=False))
except Exception as e: print("int_mm", e)
qtc = q.t().contiguous()
try:
    print("_int_mm contiguous KN cold", tm(lambda: torch._int_mm(x.to(torch.int8), qtc)))
except Exception as e: print("int_mm2", e)
# onednn
try:
    wp = torch.ops.onednn.qlinear_prepack(q, [1, K])
    print(type(wp))
    def od():
        xs = float(x.float().abs().amax() / 127)
        xq = (x.float() / xs).round().add_(128).to(torch.uint8)
        return torch.ops.onednn.qlinear_pointwise(xq, xs, 128, wp, s, torch.zeros(N, dtype=torch.long), None, 1.0, 0, torch.float32, "none", [], "")
    print("onednn cold", tm(od), "warm", tm(od, cold=False))
    print((od() - x.float() @ (q.float()*s[:,None]).t()).abs().max())
except Exception as e: print("onednn", repr(e)[:500])
G = 32
g = w.view(N, K // G, G); lo = g.amin(-1); hi = g.amax(-1); sc = (hi - lo).clamp(min=1e-8) / 15
codes = ((g - lo[..., None]) / sc[..., None]).round().clamp(0, 15).to(torch.int32).view(N, K)
pk = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
sz = torch.stack([sc, lo + 8 * sc], -1).transpose(0, 1).contiguous().to(torch.bfloat16)
print("int4 g32 cold", tm(lambda: torch._weight_int4pack_mm_for_cpu(x, pk, G, sz)))
