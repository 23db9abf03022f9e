# Quality of the int8 LM head through fbgemm (per-tensor activation quantisation), with
# SmoothQuant-style scales or outlier channels kept in float, and of an int4 head. Output: results.txt.
import torch, warnings, math
import torch.nn.functional as F
warnings.filterwarnings("ignore")
from pathlib import Path
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.kv_quality import EVAL_TEXT
from backend.weights.loader import load_model_source
src = load_model_source("smollm2-135m-instruct")
eng = LLMEngine(EngineConfig(kv_cache_memory_gib=0.25, max_model_len=2048, enable_prefix_caching=False), src)
m = eng.runner.model; head = m.lm_head
rec = []
orig = head.forward
def fwd(x):
    rec.append(x.clone()); return orig(x)
head.forward = fwd
def hidden(text):
    rec.clear(); toks = src.tokenizer.encode(text)[:2000]; eng.score(toks); return torch.cat(rec)[:len(toks)-1], toks
Xc, _ = hidden(Path("backend/data/calibration.txt").read_text())
X, toks = hidden(EVAL_TEXT.read_text())
print("calib", Xc.shape, "eval", X.shape)
q, s = head.q, head.scale.float()
N, K = q.shape
Wd = m.embed.float()  # the model-dtype head
dense = X.float() @ Wd.t()
ref8 = torch._weight_int8pack_mm(X, q, head.scale).float()
tgt = torch.tensor(toks[1:])
def stats(name, lg, ref=dense):
    lp, rp = F.log_softmax(lg, -1), F.log_softmax(ref, -1)
    print(f"{name:40s} top1 {(lg.argmax(-1) == ref.argmax(-1)).float().mean().item():.4f} kl {F.kl_div(lp, rp, log_target=True, reduction='batchmean').item():.5f} ppl {math.exp(F.cross_entropy(lg, tgt).item()):.3f}")
stats("dense (model dtype)", dense); stats("int8pack (file Q8_0 rounded)", ref8)
def dyn(Wf, Xf):
    s_ = Wf.abs().amax(1) / 127; qq = (Wf / s_[:, None]).round().clamp(-127, 127).to(torch.int8)
    pk = torch.ops.quantized.linear_prepack(torch._make_per_channel_quantized_tensor(qq, s_.double(), torch.zeros(N, dtype=torch.long), 0), None)
    return torch.cat([torch.ops.quantized.linear_dynamic(Xf[i:i+1], pk, False) for i in range(Xf.shape[0])])
Wq = q.float() * s[:, None]
stats("fbgemm dyn, file codes", dyn(Wq, X.float()))
amax_x = Xc.float().abs().amax(0)  # [K]
amax_w = Wq.abs().amax(0)
for a in (0.3, 0.5, 0.7):
    sc = (amax_x.clamp(min=1e-5) ** a / amax_w.clamp(min=1e-5) ** (1 - a))
    stats(f"smooth a={a}", dyn(Wq * sc, X.float() / sc))
# outlier split
for k in (4, 8, 16):
    idx = amax_x.topk(k).indices; rest = torch.ones(K, dtype=torch.bool); rest[idx] = False
    lg = dyn(Wq[:, rest], X.float()[:, rest]) + X.float()[:, idx] @ Wq[:, idx].t()
    stats(f"outlier split k={k}", lg)
print("top amax_x", amax_x.topk(10))
for G in (32, 64):  # the head as int4 (torch's CPU int4 kernel), group-wise from the dense values
    g = Wd.view(N, K // G, G); lo = g.amin(-1); sc = (g.amax(-1) - lo).clamp(min=1e-8) / 15
    codes = ((g - lo[..., None]) / sc[..., None]).round().clamp(0, 15).to(torch.int32).view(N, K)
    p4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    sz = torch.stack([sc, lo + 8 * sc], -1).transpose(0, 1).contiguous().to(torch.bfloat16)
    stats(f"int4 g{G} head from dense", torch._weight_int4pack_mm_for_cpu(X, p4, G, sz).float())
