"""Ad hoc: the int8 head's one-row GEMV (49,152 x 576, int8 codes, a bf16 scale per row) as
torch.compile (inductor) generates it from a plain expression (the codes widened, times x,
summed per row in fp32, times the scale), against ``torch._weight_int8pack_mm``; random
codes; hot (repeated calls) and cold (a 256 MB buffer written before each call); two rounds.

    PYTHONPATH=. python inductor_head.py"""
import time, torch
from benchmarks.quant import _cpu_time_us
torch.manual_seed(0)
N,K=49152,576
w=torch.randint(-127,127,(N,K),dtype=torch.int8); sc=torch.rand(N).to(torch.bfloat16)
x=torch.randn(1,K).to(torch.bfloat16)
big=torch.randn(64<<20)
def gemv(x, w, sc):
    return (w.to(torch.float32) * x.to(torch.float32)).sum(-1) * sc.to(torch.float32)
t=time.perf_counter()
cg=torch.compile(gemv, dynamic=False)
y=cg(x, w, sc); print("compile s %.1f" % (time.perf_counter()-t))
ref=torch._weight_int8pack_mm(x,w,sc).float()[0]
full=(x.float() @ w.float().T)[0]*sc.float()
print("max rel err vs fp32: compiled %.2e, int8pack %.2e" % (((y-full).abs().max()/full.abs().max()).item(), ((ref-full).abs().max()/full.abs().max()).item()))
import statistics
for rnd in range(2):
    for name, fn in (("int8pack_mm", lambda: torch._weight_int8pack_mm(x,w,sc)), ("inductor", lambda: cg(x,w,sc))):
        hot=_cpu_time_us(fn, 100)/1e3
        ts=[]
        for _ in range(20):
            big.add_(1.0)
            t=time.perf_counter(); fn(); ts.append(time.perf_counter()-t)
        print(f"{name}: hot {hot:.3f} ms cold {statistics.median(ts)*1e3:.3f} ms")
