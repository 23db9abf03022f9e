"""Ad hoc: one decode layer's K/V read (320 contiguous slots of a 30-layer cache the engine's
size) then SDPA, with the caches evicted before each pass over the 30 layers: index_select
(the engine's gather), a contiguous clone, and SDPA on a view without a copy."""
import time, torch
import torch.nn.functional as F
L, S = 30, 93216
data = torch.zeros(L, S, 2, 3, 64, dtype=torch.bfloat16)
C = 320
slots = torch.arange(1600, 1600 + C)
for l in range(L):
    data[l].index_copy_(0, slots, torch.randn(C, 2, 3, 64).to(torch.bfloat16))
junk = torch.zeros(64 << 20, dtype=torch.uint8)
q = torch.randn(1, 3, 3, 64, dtype=torch.bfloat16)
def evict():
    junk.add_(1)
def g_select(l):
    return data[l].index_select(0, slots)
def g_clone(l):
    return data[l].narrow(0, 1600, C).clone()
def attend(kv):
    kv = kv.view(1, C, 2, 3, 64)
    return F.scaled_dot_product_attention(q, kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2), scale=0.125)
res = {}
for name, fn in (("index_select", lambda l: attend(g_select(l))), ("narrow+clone", lambda l: attend(g_clone(l))),
                 ("view (no copy)", lambda l: attend(data[l].narrow(0, 1600, C))),
                 ("index_select", lambda l: attend(g_select(l))), ("narrow+clone", lambda l: attend(g_clone(l))),
                 ("view (no copy)", lambda l: attend(data[l].narrow(0, 1600, C)))):
    ts = []
    for r in range(40):
        evict()
        t = time.perf_counter()
        for l in range(L):
            fn(l)
        ts.append(time.perf_counter() - t)
    ts.sort(); res.setdefault(name, []).append(round(ts[20] / L * 1e6, 1))
print("per layer (gather + SDPA, caches evicted before each 30-layer pass), us:", res)
