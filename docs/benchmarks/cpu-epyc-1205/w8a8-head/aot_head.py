"""Ad hoc: the int8 head's one-row GEMV (as ``inductor_head.py``) compiled ahead of time
(torch.export + AOTInductor into a .pt2 package), then loaded and timed against
``torch._weight_int8pack_mm``: compile, load and first-call times, hot and cold calls.

    PYTHONPATH=. python aot_head.py"""
import time, statistics, os, torch
from benchmarks.quant import _cpu_time_us
torch.manual_seed(0)
N,K=49152,576
w=torch.randint(-127,127,(N,K),dtype=torch.int8); sc=torch.rand(N).to(torch.bfloat16)
x=torch.randn(1,K).to(torch.bfloat16)
class Head(torch.nn.Module):
    def forward(self, x, w, sc):
        return (w.to(torch.float32) * x.to(torch.float32)).sum(-1) * sc.to(torch.float32)
path="/tmp/aot_head.pt2"
t=time.perf_counter()
ep=torch.export.export(Head(), (x, w, sc))
pkg=torch._inductor.aoti_compile_and_package(ep, package_path=path)
print("aot compile s %.1f" % (time.perf_counter()-t), os.path.getsize(path))
t=time.perf_counter()
fn=torch._inductor.aoti_load_package(path)
print("load s %.3f" % (time.perf_counter()-t))
t=time.perf_counter(); y=fn(x, w, sc); print("first call s %.3f" % (time.perf_counter()-t))
full=(x.float() @ w.float().T)[0]*sc.float()
y = y[0] if isinstance(y, (list, tuple)) else y
print("rel err %.1e" % ((y-full).abs().max()/full.abs().max()).item())
big=torch.randn(64<<20)
for rnd in range(2):
    for name, f in (("int8pack_mm", lambda: torch._weight_int8pack_mm(x,w,sc)), ("aot", lambda: fn(x,w,sc))):
        hot=_cpu_time_us(f, 100)/1e3
        ts=[]
        for _ in range(20):
            big.add_(1.0); t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
        print(f"{name}: hot {hot:.3f} ms cold {statistics.median(ts)*1e3:.3f} ms")
