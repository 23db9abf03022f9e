# The blocks as one bare function over the engine's weights and ops (330-token context, greedy
# argmax), against the engine's step on a fresh 300-token prompt (60 steps), alternating. Output: bare-function.txt.
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
def step(x, cos, sin):
    res = x
    h = norm(x, L[0][0])
    for i, (n1, qp, qs, op, os_, n2, gp, gs, dp, ds) in enumerate(L):
        if i:
            res = res + x
            h = norm(res, n1)
        qkv = mm(h, qp, 32, qs)
        qk = qkv[:, :(H + kvh) * hd].view(1, H + kvh, hd)
        r = qk.roll(32, -1); r[..., :32].neg_()
        torch.add(qk * cos, r * sin, out=qk)
        d = data[i]
        d.index_copy_(0, slot, qkv[:, H * hd:].view(1, 2, kvh, hd))
        kv = d.index_select(0, idx)
        k = kv[:, 0].transpose(0, 1).unsqueeze(0); v = kv[:, 1].transpose(0, 1).unsqueeze(0)
        q = qkv[:, :H * hd].view(1, kvh, 3, hd)
        o = F.scaled_dot_product_attention(q, k, v).reshape(1, H * hd)
        a = mm(o, op, 32, os_)
        res = res + a
        h = norm(res, n2)
        gu = mm(h, gp, 32, gs)
        g = F.silu(gu[:, :inter]) * gu[:, inter:]
        x = mm(g, dp, 32, ds)
    res = res + x
    h = norm(res, fnorm)
    return head(h).float().argmax(-1)
x = torch.randn(1, 576, dtype=torch.bfloat16)
cos, sin = m.cos_table[C:C+1].unsqueeze(1), m.sin_table[C:C+1].unsqueeze(1)
if __name__ == "__main__":  # (compile-pieces/ imports the set-up above)
    def lean(n=60):
        t = time.perf_counter()
        for _ in range(n): step(x, cos, sin)
        return (time.perf_counter() - t) / n * 1e3
    def engine(n=60):
        eng.add_request(f"a{time.time()}", list(range(100, 400)), SamplingParams(max_tokens=n + 5, ignore_eos=True, temperature=0))
        for _ in range(3): eng.step()
        t = time.perf_counter()
        for _ in range(n): eng.step()
        r = (time.perf_counter() - t) / n * 1e3
        while eng.has_unfinished(): eng.step()
        return r
    lean(5); engine(5)
    a, b = [], []
    for r in range(5):
        a.append(lean()); b.append(engine())
    print("lean step ms", [round(v, 2) for v in a], statistics.median(a))
    print("engine step ms", [round(v, 2) for v in b], statistics.median(b))
