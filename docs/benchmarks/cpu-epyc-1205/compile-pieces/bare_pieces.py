# Tried and dropped: the pieces between attention calls of a batch-1 SmolLM2 decode step
# (norm + qkv + RoPE; o + norm + gate_up + SiLU-mul + down) as bare functions over the
# engine's weights, eager against torch.compile (inductor's C++ kernels, cpp.threads = 1;
# attention eager between them; 330-token context). Output: bare-pieces.txt.
import time, torch, sys, statistics
import torch.nn.functional as F
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.weights.loader import load_model_source
from backend.layers.fused_ops import _doubled
torch.set_grad_enabled(False)
eng = LLMEngine(EngineConfig(kv_cache_memory_gib=0.25, max_model_len=1024, enable_prefix_caching=False), load_model_source("smollm2-135m-instruct"))
m = eng.runner.model
H, kvh, hd, inter, D = 9, 3, 64, 1536, 576
eps = m.cfg.rms_norm_eps
L = [(_doubled(l.input_norm), l.qkv.packed, l.qkv.scale_zero, l.o.packed, l.o.scale_zero, _doubled(l.post_norm),
      l.gate_up.packed, l.gate_up.scale_zero, l.down.packed, l.down.scale_zero) for l in m.layers]
fnorm = _doubled(m.norm)
head = m.lm_head
cache = eng.runner.kv_cache.data if hasattr(eng.runner, "kv_cache") else None
print(type(cache))
C = 330
data = torch.zeros(30, 1024, 2, kvh, hd, dtype=torch.bfloat16)
idx = torch.arange(C + 1)
slot = torch.tensor([C])
def norm(x, w2):
    return F.layer_norm(torch.cat((x, -x), -1), (2 * D,), w2, None, eps)[:, :D]
mm = torch._weight_int4pack_mm_for_cpu
def norm(x, w2):
    return F.layer_norm(torch.cat((x, -x), -1), (2 * D,), w2, None, eps)[:, :D]
mm = torch._weight_int4pack_mm_for_cpu
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
C = 330
data = torch.zeros(30, 1024, 2, kvh, hd, dtype=torch.bfloat16)
idx = torch.arange(C + 1)
slot = torch.tensor([C])
x = torch.randn(1, 576, dtype=torch.bfloat16)
cos, sin = m.cos_table[C:C+1].unsqueeze(1), m.sin_table[C:C+1].unsqueeze(1)
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
