"""Ad hoc, CUDA: the one-pass dequantisers against the torch expressions on Llama-2-7B's
shapes in bf16: equal bits, and µs per call (weights rotated past L2) each way."""
import json
import torch
from backend.layers import gpu_dequant, quant_kernels as qk
from backend.layers.quantize import quantize_int4, quantize_int8
from benchmarks.quant import copies_past_l2, time_rotating
dev = torch.device("cuda")
out = []
for name, N, K in (("qkv", 12288, 4096), ("o", 4096, 4096), ("gate_up", 22016, 4096), ("down", 4096, 11008)):
    w = torch.randn(N, K, device=dev) * 0.02
    g = quantize_int4(w, 128)
    packed = qk.pack_int4(g.codes)
    s4, z4 = g.scale.bfloat16(), g.min.bfloat16()
    q, s8 = quantize_int8(w)
    s8 = s8.bfloat16()
    del w, g
    row = {"shape": name, "N": N, "K": K}
    row["int4_equal"] = torch.equal(gpu_dequant.int4_dense(packed, s4, z4, 128),
                                    qk.dequantize_int4(packed, s4, z4, 128))
    row["int8_equal"] = torch.equal(gpu_dequant.int8_dense(q, s8, torch.bfloat16),
                                    q.to(torch.bfloat16) * s8.unsqueeze(1))
    n4 = copies_past_l2(packed.numel())
    ps = [packed] + [packed.clone() for _ in range(n4 - 1)]
    row["int4_triton_us"] = time_rotating([lambda p=p: gpu_dequant.int4_dense(p, s4, z4, 128) for p in ps], dev)
    row["int4_torch_us"] = time_rotating([lambda p=p: qk.dequantize_int4(p, s4, z4, 128) for p in ps], dev)
    del ps
    n8 = copies_past_l2(q.numel())
    qs = [q] + [q.clone() for _ in range(n8 - 1)]
    row["int8_triton_us"] = time_rotating([lambda c=c: gpu_dequant.int8_dense(c, s8, torch.bfloat16) for c in qs], dev)
    row["int8_torch_us"] = time_rotating([lambda c=c: c.to(torch.bfloat16) * s8.unsqueeze(1) for c in qs], dev)
    del qs
    torch.cuda.empty_cache()
    print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
