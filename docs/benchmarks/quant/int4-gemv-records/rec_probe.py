"""(Runs against the tree before the scale records, commit 07c865c:
``int4_matmul(x, packed, scale, lo, G)``; see call3.sh.)
H200 probe: the int4 g128 one-token GEMV with 8-byte scale records (rec_kernel) against
the committed kernel, per Llama-2-7B shape with codes AND scales rotated past L2, then the
engine's batch-1 step with the best variant patched in (alternating, one process).

    python rec_probe.py OUT_DIR
"""
import itertools
import json
import sys
import time
from functools import partial
from pathlib import Path

import torch

from backend.layers import pdl
from backend.layers import quant_kernels as qk
from backend.layers.gpu import multiprocessors
from backend.layers.linear import Int4Linear
from backend.layers.quantize import quantize_int4
from benchmarks.quant import copies_past_l2, engine_level, rel_err, time_rotating
from benchmarks.quant_sweep import SHAPES_7B, SWEEP_ROTATE_BYTES, copy_gbs
import rec_kernel as rk

out_dir = Path(sys.argv[1])
out_dir.mkdir(parents=True, exist_ok=True)
dev = torch.device("cuda")
sms = multiprocessors(dev, 132)
launch = pdl.launch(dev)
G = 128
res = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
       "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
       "copy_gbs": round(copy_gbs(dev), 1), "shapes": {}, "variants": {}}
print("copy GB/s", res["copy_gbs"], flush=True)

variants = {}
for (bn, nw), st, xw, pps in itertools.product(((64, 2), (128, 4), (32, 1), (64, 4)),
                                                (1, 2, 3, 4), (0, 1), (4, 8)):
    if pps == 8 and nw == 4:
        continue
    variants[f"rec bn{bn} w{nw} st{st} xw{xw} pps{pps}"] = dict(
        BLOCK_N=bn, GROUPS=1, STAGES=st, XW=xw, PROGRAMS_PER_SM=pps, num_warps=nw, num_stages=3)

times = {"committed": {}} | {k: {} for k in variants}
errs = {k: {} for k in times}
for name, N, K in SHAPES_7B:
    gen = torch.Generator(device=dev).manual_seed(0)
    w = torch.randn(N, K, device=dev, generator=gen) * 0.02
    g = quantize_int4(w, G)
    packed = qk.pack_int4(g.codes)
    scale, lo = g.scale.to(torch.bfloat16).contiguous(), g.min.to(torch.bfloat16).contiguous()
    ref = qk.dequantize_int4(packed, scale, lo, G).float()
    del w, g
    x = (torch.randn(1, K, device=dev, generator=gen)).to(torch.bfloat16)
    r = x.float() @ ref.T
    n = copies_past_l2(packed.numel() + 2 * scale.numel() * 2, SWEEP_ROTATE_BYTES)
    copies = [(packed, scale, lo)] + [(packed.clone(), scale.clone(), lo.clone())
                                      for _ in range(n - 1)]
    recs = [rk.records(s, z) for _, s, z in copies]
    y0 = qk.int4_matmul(x, packed, scale, lo, G)
    errs["committed"][name] = rel_err(y0, r)
    times["committed"][name] = time_rotating(
        [partial(qk.int4_matmul, x, p, s, z, G) for p, s, z in copies], dev)
    for key, cfg in variants.items():
        try:
            y = rk.int4_gemv_rec(x, packed, recs[0], G, cfg, sms, launch)
            torch.cuda.synchronize()
            errs[key][name] = rel_err(y, r)
            same = torch.equal(y, y0)
            if errs[key][name] > 0.02:
                raise ValueError(f"error {errs[key][name]}")
            times[key][name] = time_rotating(
                [partial(rk.int4_gemv_rec, x, p, sz, G, cfg, sms, launch)
                 for (p, _, _), sz in zip(copies, recs)], dev)
            errs[key][name + "_same_bits"] = same
        except Exception as e:  # noqa: BLE001 - a variant that cannot run is reported
            times[key][name] = None
            errs[key][name + "_error"] = repr(e)[:200]
    print(name, N, K, "committed", round(times["committed"][name], 2), flush=True)
    del copies, recs, ref
    torch.cuda.empty_cache()

block = {k: (round(sum(v.values()), 2) if v and None not in v.values() else None)
         for k, v in times.items()}
ranked = sorted((b, k) for k, b in block.items() if b is not None)
res["per_shape_us"] = times
res["errors"] = errs
res["block_us"] = block
res["ranked"] = ranked[:20]
for b, k in ranked[:12]:
    print(f"{b:8.2f} {k}  " + " ".join(f"{n}={times[k][n]:.1f}" for n, _, _ in SHAPES_7B))
print("committed", block["committed"], flush=True)
(out_dir / "probe.json").write_text(json.dumps(res, indent=1))

# engine A/B at batch 1 (16-token prompts, 48 synced steps), the best variant patched in
best = variants[ranked[0][1]] if ranked[0][1] != "committed" else variants[ranked[1][1]]
REC, ACTIVE = {}, [False]
orig_pack, orig_mm = Int4Linear._pack, qk.int4_matmul


def pack(self, stage):
    orig_pack(self, stage)
    if self.device.type == "cuda":
        REC[self.scale.data_ptr()] = rk.records(self.scale, self.min)


def mm(x, packed, scale, lo, group_size, config=None):
    if ACTIVE[0] and x.shape[0] == 1 and config is None and scale.data_ptr() in REC:
        return rk.int4_gemv_rec(x.contiguous(), packed, REC[scale.data_ptr()], group_size,
                                best, sms, launch)
    return orig_mm(x, packed, scale, lo, group_size, config)


Int4Linear._pack, qk.int4_matmul = pack, mm
eng = []
for rnd in range(2):
    for active in (False, True):
        ACTIVE[0] = active
        e = engine_level("int4", G, batches=(1,))
        e["records_gemv"] = active
        e["round"] = rnd
        eng.append(e)
        REC.clear()
        print("engine", active, e.get("step_ms_batch1"), flush=True)
res["engine_best_cfg"] = best
res["engine"] = eng
(out_dir / "probe.json").write_text(json.dumps(res, indent=1))
print(res["date"], "->", time.strftime("%H:%M:%S", time.gmtime()))
