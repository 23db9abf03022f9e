"""Ad hoc: as w8a8_quality.py, with SmoothQuant-style per-input scales s = max|x|^a /
max|W|^(1-a) (x from backend/data/calibration.txt) folded into the head before its int8
re-quantisation, scored on the three other texts.

    PYTHONPATH=.:docs/benchmarks/cpu-epyc-1205/w8a8-head python docs/benchmarks/cpu-epyc-1205/w8a8-head/w8a8_smooth.py"""
import math
import torch
import torch.nn.functional as F
from backend.engine.kv_quality import EVAL_TEXT
from backend.layers.quantize import quantize_int8
from common import head_inputs, median_ms as t
names = ["calibration", "kv_eval", "README", "ARCH"]
head, captured, toks = head_inputs(["backend/data/calibration.txt", EVAL_TEXT, "README.md",
                                    "docs/ARCHITECTURE.md"])
N, K = head.q.shape
W = head.q.float() * head.scale.float()[:, None]   # the int8 head's own weights
xmax = captured[0].float().abs().amax(0).clamp(min=1e-5)
wmax = W.abs().amax(0).clamp(min=1e-5)
print("x absmax: max %.2f median %.3f" % (xmax.max(), xmax.median()))
for alpha in (0.0, 0.5, 0.65, 0.8):
    s = (xmax ** alpha / wmax ** (1 - alpha)) if alpha > 0 else torch.ones(K)
    q, sc = quantize_int8(W * s[None, :], torch.float32)
    wq = torch._make_per_channel_quantized_tensor(q, sc.double(), torch.zeros(N, dtype=torch.long), 0)
    pk = torch.ops.quantized.linear_prepack(wq, None)
    inv = (1.0 / s)
    res = []
    for name, h, ids in list(zip(names, captured, toks))[1:]:
        h = h.float(); target = torch.tensor(ids[1:])
        full = h @ W.T
        w8 = torch.cat([torch._weight_int8pack_mm(h[i:i+1].to(head.q.dtype if False else torch.bfloat16), head.q, head.scale) for i in range(h.shape[0])]).float()
        lg = torch.cat([torch.ops.quantized.linear_dynamic(h[i:i+1] * inv, pk, False) for i in range(h.shape[0])])
        res.append({"text": name, "ppl_w8": round(math.exp(F.cross_entropy(w8[:-1], target).item()), 3),
                    "ppl": round(math.exp(F.cross_entropy(lg[:-1], target).item()), 3),
                    "ppl_fp32": round(math.exp(F.cross_entropy(full[:-1], target).item()), 3),
                    "top1_vs_fp32": round((lg[:-1].argmax(-1) == full[:-1].argmax(-1)).float().mean().item(), 4),
                    "w8_top1_vs_fp32": round((w8[:-1].argmax(-1) == full[:-1].argmax(-1)).float().mean().item(), 4),
                    "top1_vs_w8": round((lg[:-1].argmax(-1) == w8[:-1].argmax(-1)).float().mean().item(), 4)})
    x = captured[1][7:8].float()
    print("alpha", alpha, res, "ms %.3f" % t(lambda: torch.ops.quantized.linear_dynamic(x * inv, pk, False)))
