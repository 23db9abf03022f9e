"""Ad hoc: the engine's gather (index_select of 320 contiguous slots) on a 30-layer cache of
the engine's shape, warm caches, with and without inference mode."""
import time, torch
L, NB, BS = 30, 93216 // 16, 16
data = torch.zeros(L, NB * BS, 2, 3, 64, dtype=torch.bfloat16)
C = 320
slots = torch.arange(1600, 1600 + C)
for l in range(L):
    data[l].index_copy_(0, slots, torch.randn(C, 2, 3, 64).to(torch.bfloat16))
idx = slots.view(1, C)
def by_slots():
    for l in range(L):
        data[l].index_select(0, idx.reshape(-1))
def bench(fn, n=100):
    for _ in range(5): fn()
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); fn(); ts.append(time.perf_counter()-t)
    ts.sort(); return ts[len(ts)//2]*1e6 / L
print("per layer us: %.1f" % bench(by_slots))
with torch.inference_mode():
    print("inference_mode per layer us: %.1f" % bench(by_slots))
