# Tried and dropped: the pieces between attention calls of a batch-1 SmolLM2 decode step
# (norm + qkv + RoPE; o + norm + gate_up + SiLU-mul + down) as bare functions over the
# engine's weights, eager against torch.compile (inductor's C++ kernels, cpp.threads = 1;
# attention eager between them; 330-token context). Output: bare-pieces.txt.
import os, sys, time, torch
import torch.nn.functional as F
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "flat-loop"))
from bare_function import H, L, cos, data, fnorm, hd, head, idx, inter, kvh, mm, norm, sin, slot, x  # the set-up
def rope(qkv, cos, sin):
    qk = qkv[:, :(H + kvh) * hd].view(-1, H + kvh, hd)
    r = qk.roll(32, -1); r[..., :32].neg_()
    torch.add(qk * cos, r * sin, out=qk)
    return qkv
def attend(i, qkv):
    d = data[i]
    d.index_copy_(0, slot, qkv[:, H * hd:].view(1, 2, kvh, hd))
    kv = d.index_select(0, idx)
    k = kv[:, 0].transpose(0, 1).unsqueeze(0); v = kv[:, 1].transpose(0, 1).unsqueeze(0)
    q = qkv[:, :H * hd].view(1, kvh, 3, hd)
    return F.scaled_dot_product_attention(q, k, v).reshape(1, H * hd)
def first(x, n1, qp, qs, cos, sin):
    h = norm(x, n1)
    return rope(mm(h, qp, 32, qs), cos, sin), x
def between(o, res, op, os_, n2, gp, gs, dp, ds, n1, qp, qs, cos, sin):
    res = res + mm(o, op, 32, os_)
    gu = mm(norm(res, n2), gp, 32, gs)
    x = mm(F.silu(gu[:, :inter]) * gu[:, inter:], dp, 32, ds)
    res = res + x
    return rope(mm(norm(res, n1), qp, 32, qs), cos, sin), res
def last(o, res, op, os_, n2, gp, gs, dp, ds, fnorm):
    res = res + mm(o, op, 32, os_)
    gu = mm(norm(res, n2), gp, 32, gs)
    x = mm(F.silu(gu[:, :inter]) * gu[:, inter:], dp, 32, ds)
    return norm(res + x, fnorm)
def make_step(first, between, last):
    def step(x, cos, sin):
        qkv, res = first(x, L[0][0], L[0][1], L[0][2], cos, sin)
        for i in range(30):
            n1, qp, qs, op, os_, n2, gp, gs, dp, ds = L[i]
            o = attend(i, qkv)
            if i < 29:
                nx = L[i + 1]
                qkv, res = between(o, res, op, os_, n2, gp, gs, dp, ds, nx[0], nx[1], nx[2], cos, sin)
            else:
                h = last(o, res, op, os_, n2, gp, gs, dp, ds, fnorm)
        return head(h).float().argmax(-1)
    return step
import torch._inductor.config as ic; ic.cpp.threads = 1
eager = make_step(first, between, last)
t = time.perf_counter()
comp = make_step(*(torch.compile(f, dynamic=False) for f in (first, between, last)))
comp(x, cos, sin)
print("compile s", time.perf_counter() - t, flush=True)
data.zero_(); a = eager(x, cos, sin); data.zero_(); b = comp(x, cos, sin)
print("argmax", a.item(), b.item())
def lean(fn, n=60):
    t = time.perf_counter()
    for _ in range(n): fn(x, cos, sin)
    return (time.perf_counter() - t) / n * 1e3
for r in range(4):
    print("eager", round(lean(eager), 2), "compiled", round(lean(comp), 2), flush=True)
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU]) as p:
    for _ in range(10): comp(x, cos, sin)
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=16))
