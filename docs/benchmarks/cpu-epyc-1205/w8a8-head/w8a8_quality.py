"""Ad hoc: the embedded SmolLM2's int8 head (CPU defaults) with int8 activations through
fbgemm's dynamic linear (x quantised per row, as a decode step's one row; then per block of
64 / 96 / 192 inputs, one call each) against the weight-only int8 head, on the head's inputs
at every position of three shipped texts (1,024 tokens each); the head timed hot.

    PYTHONPATH=.:docs/benchmarks/cpu-epyc-1205/w8a8-head python docs/benchmarks/cpu-epyc-1205/w8a8-head/w8a8_quality.py"""
import math
import torch
import torch.nn.functional as F
from backend.engine.kv_quality import EVAL_TEXT
from common import head_inputs, median_ms as t
head, captured, toks = head_inputs([EVAL_TEXT, "README.md", "docs/ARCHITECTURE.md"])
N = head.q.shape[0]
wq = torch._make_per_channel_quantized_tensor(head.q, head.scale.double(), torch.zeros(N, dtype=torch.long), 0)
packed = {rr: torch.ops.quantized.linear_prepack(wq, None) for rr in (False,)}
res = {}
for ti, (h, ids) in enumerate(zip(captured, toks)):
    target = torch.tensor(ids[1:])
    ref = torch._weight_int8pack_mm(h, head.q, head.scale).float()  # weight-only, rows at once
    ref1 = torch.cat([torch._weight_int8pack_mm(h[i:i+1], head.q, head.scale) for i in range(h.shape[0])]).float()
    out = {}
    for rr in (False, True):
        y = torch.cat([torch.ops.quantized.linear_dynamic(h[i:i+1].float(), packed[False], rr) for i in range(h.shape[0])])
        out[rr] = y
    full = (h.float() @ (head.q.float() * head.scale.float()[:, None]).T)
    for name, lg in (("w8 rows-at-once", ref), ("w8 one row", ref1), ("w8a8", out[False]), ("w8a8 reduce_range", out[True]), ("fp32 of int8 W", full)):
        lg = lg[:-1]
        nll = F.cross_entropy(lg, target).item()
        res.setdefault(name, []).append({"ppl": math.exp(nll), "top1_vs_w8_one_row": (lg.argmax(-1) == ref1[:-1].argmax(-1)).float().mean().item(),
                                         "max_rel_logit_err_vs_fp32": ((lg - full[:-1]).abs().max() / full[:-1].abs().max()).item()})
for k, v in res.items():
    print(k, [{kk: round(vv, 5) for kk, vv in d.items()} for d in v])
x = captured[0][5:6]
print("head ms: w8 %.3f  w8a8 %.3f" % (t(lambda: torch._weight_int8pack_mm(x, head.q, head.scale)), t(lambda: torch.ops.quantized.linear_dynamic(x.float(), packed[False], False))))
for B in (64, 96, 192):
    nb = 576 // B
    packs = [torch.ops.quantized.linear_prepack(torch._make_per_channel_quantized_tensor(head.q[:, i*B:(i+1)*B].contiguous(), head.scale.double(), torch.zeros(N, dtype=torch.long), 0), None) for i in range(nb)]
    def blk(xr):
        xf = xr.float()
        y = torch.ops.quantized.linear_dynamic(xf[:, :B].contiguous(), packs[0], False)
        for i in range(1, nb):
            y += torch.ops.quantized.linear_dynamic(xf[:, i*B:(i+1)*B].contiguous(), packs[i], False)
        return y
    r = []
    for h, ids in zip(captured, toks):
        target = torch.tensor(ids[1:])
        ref1 = torch.cat([torch._weight_int8pack_mm(h[i:i+1], head.q, head.scale) for i in range(h.shape[0])]).float()
        full = (h.float() @ (head.q.float() * head.scale.float()[:, None]).T)
        lg = torch.cat([blk(h[i:i+1]) for i in range(h.shape[0])])[:-1]
        r.append({"ppl": round(math.exp(F.cross_entropy(lg, target).item()), 4), "top1_vs_w8": round((lg.argmax(-1) == ref1[:-1].argmax(-1)).float().mean().item(), 4),
                  "top1_vs_fp32": round((lg.argmax(-1) == full[:-1].argmax(-1)).float().mean().item(), 4),
                  "w8_top1_vs_fp32": round((ref1[:-1].argmax(-1) == full[:-1].argmax(-1)).float().mean().item(), 4)})
    print("blocks of", B, r, "ms %.3f" % t(lambda: blk(x)))
