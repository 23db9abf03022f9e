"""H200 check of the committed scale_min records (``quant_kernels.pack_scale_min``): per
Llama-2-7B shape, the one-token GEMV against the probe kernel (same bits expected), against
the dequantised reference, and timed with codes and records rotated past L2; the GEMM at 16
and 64 tokens against the reference; ``gpu_dequant.int4_dense`` against the torch
dequantiser bit for bit.

    python check_gpu.py OUT_JSON
"""
import json
import sys
import time
from functools import partial

import torch

from backend.layers import gpu_dequant, pdl
from backend.layers import quant_kernels as qk
from backend.layers.gpu import multiprocessors
from backend.layers.quantize import quantize_int4
from benchmarks.quant import copies_past_l2, rel_err, time_rotating
from benchmarks.quant_sweep import SHAPES_7B, SWEEP_ROTATE_BYTES, copy_gbs
import rec_kernel as rk

dev = torch.device("cuda")
G = 128
PROBE_BEST = dict(BLOCK_N=64, GROUPS=1, STAGES=3, XW=1, PROGRAMS_PER_SM=4, num_warps=2,
                  num_stages=3)
res = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
       "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
       "copy_gbs": round(copy_gbs(dev), 1), "shapes": {}}
sms, launch = multiprocessors(dev, 132), pdl.launch(dev)
for name, N, K in SHAPES_7B:
    gen = torch.Generator(device=dev).manual_seed(0)
    g = quantize_int4(torch.randn(N, K, device=dev, generator=gen) * 0.02, G)
    packed = qk.pack_int4(g.codes)
    scale, lo = g.scale.to(torch.bfloat16), g.min.to(torch.bfloat16)
    sm = qk.pack_scale_min(scale, lo)
    row = {"records_equal_probe_layout": torch.equal(
        sm.view(torch.int64).view(N, -1), rk.records(scale, lo))}
    dense = gpu_dequant.int4_dense(packed, sm, G)
    want = qk.dequantize_int4(packed, sm, G)
    row["int4_dense_same_bits"] = torch.equal(dense, want)
    ref = want.float()
    for M in (1, 16, 64):
        x = torch.randn(M, K, device=dev, generator=gen).to(torch.bfloat16)
        y = qk.int4_matmul(x, packed, sm, G)
        row[f"rel_err_M{M}"] = rel_err(y, x.float() @ ref.T)
        if M == 1:
            y_probe = rk.int4_gemv_rec(x, packed, sm.view(torch.int64).view(N, -1), G,
                                       PROBE_BEST, sms, launch)
            row["gemv_same_bits_as_probe"] = torch.equal(y, y_probe)
            runs = [qk.int4_matmul(x, packed, sm, G) for _ in range(20)]
            row["gemv_deterministic_20"] = all(torch.equal(r, y) for r in runs)
            n = copies_past_l2(packed.numel() + sm.numel() * 2, SWEEP_ROTATE_BYTES)
            copies = [(packed, sm)] + [(packed.clone(), sm.clone()) for _ in range(n - 1)]
            row["gemv_us"] = round(time_rotating(
                [partial(qk.int4_matmul, x, p, s, G) for p, s in copies], dev), 2)
            del copies
    res["shapes"][name] = row
    print(name, row, flush=True)
    del g, dense, want, ref
    torch.cuda.empty_cache()
res["block_gemv_us"] = round(sum(r["gemv_us"] for r in res["shapes"].values()), 2)
print("block", res["block_gemv_us"], "copy", res["copy_gbs"], flush=True)
with open(sys.argv[1], "w") as f:
    json.dump(res, f, indent=1)
