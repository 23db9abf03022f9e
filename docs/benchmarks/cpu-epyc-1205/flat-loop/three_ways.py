# Three ways in turn, 6 rounds of 48 batch-1 steps: each block's forward ("layers"), the flat loop
# ("flat"), a bare-function prototype wired into the engine ("proto"). Output: three-ways.json.
import sys, time, statistics, json, torch
import torch.nn.functional as F
sys.path.insert(0, "docs/benchmarks/cpu-epyc-1205")
from copy_ab import decode_ms
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.model import LlamaModel
from backend.weights.loader import load_model_source
from backend.layers.fused_ops import EAGER
eng = LLMEngine(EngineConfig(kv_cache_memory_gib=0.5, max_model_len=1024, max_num_seqs=64, enable_prefix_caching=False), load_model_source("smollm2-135m-instruct"))
m = eng.runner.model
orig = m.forward
plan = [(l.input_norm, l.qkv.forward, l.o.forward, l.post_norm, l.gate_up.forward, l.down.forward) for l in m.layers]
H, kvh, hd = m.layers[0].H, m.layers[0].kvh, m.layers[0].hd
eps = m.cfg.rms_norm_eps
norm, rope, silu_mul = EAGER.add_rms_norm, EAGER.rope_, EAGER.silu_mul
def lean(input_ids, positions, attn, meta, logits_indices, in_graph=False):
    if meta.prefill_spans:
        return orig(input_ids, positions, attn, meta, logits_indices, in_graph)
    T = input_ids.shape[0]
    x = F.embedding(input_ids, m.embed)
    cos, sin = m.cos_table[positions], m.sin_table[positions]
    residual = None
    kv_write, decode = attn.kv_cache.write, attn._decode
    for i, (n1, qkv_f, o_f, n2, gu_f, down_f) in enumerate(plan):
        h, residual = norm(x, residual, n1, eps)
        qkv = qkv_f(h)
        rope(qkv[:, : (H + kvh) * hd].view(T, H + kvh, hd), cos, sin)
        kv = qkv[:, H * hd:].view(T, 2, kvh, hd)
        kv_write(i, meta.slot_mapping, kv[:, 0], kv[:, 1])
        out = decode(i, qkv[:, : H * hd].view(T, H, hd), meta).view(T, H * hd)
        h, residual = norm(o_f(out), residual, n2, eps)
        x = down_f(silu_mul(gu_f(h)))
    return m.head_fn(x, residual, logits_indices, EAGER)
def use(name):
    LlamaModel.flat_eager = name != "layers"
    if name == "proto": m.forward = lean
    else: m.__dict__.pop("forward", None)
decode_ms(eng, 4, 4)
names = ["layers", "flat", "proto"]
res = {n: [] for n in names}
for r in range(int(sys.argv[1])):
    for name in (names if r % 2 == 0 else names[::-1]):
        use(name)
        res[name].append(round(decode_ms(eng, 1, 48), 2))
print(json.dumps({k: (statistics.median(v), v) for k, v in res.items()}))
