"""SmolLM2's 120 block matmuls (30 layers of each shape, weights rotated) at 1 and 8 rows:
the int4 x int8 op (two / one parts) against fbgemm fp16 and dense fp32.
    PYTHONPATH=. python docs/benchmarks/cpu-avx2-1207/mm.py [REPS]"""
import sys
import tempfile
import time

import torch

from backend.layers import cpu_fp16, cpu_w4a8

torch.set_num_threads(2)
d = tempfile.mkdtemp()
cpu_w4a8.build(d)
assert cpu_w4a8.load(d)
shapes = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
L = 30
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
res = {}
for M in (1, 8):
    layers = {}
    for name, (N, K) in shapes.items():
        ls = []
        for i in range(L):
            codes = torch.randint(0, 16, (N, K), dtype=torch.uint8)
            scale = torch.rand(N, K // 32) * 0.02 + 1e-3
            lo = -8 * scale
            t, sm = cpu_w4a8.pack(codes, scale, lo, 32)
            w = cpu_w4a8.dequantize(t, sm)
            ls.append((t, sm, cpu_fp16.pack(w.half()), w))
        layers[name] = ls
    x = {name: torch.randn(M, K) for name, (N, K) in shapes.items()}
    def run(kind):
        for name in shapes:
            for t, sm, p16, w in layers[name]:
                if kind == "w4a8x2":
                    cpu_w4a8.matmul(x[name], t, sm, 2)
                elif kind == "w4a8x1":
                    cpu_w4a8.matmul(x[name], t, sm, 1)
                elif kind == "fp16":
                    cpu_fp16.matmul(x[name], p16)
                else:
                    torch.nn.functional.linear(x[name], w)
    ts = {k: [] for k in ("w4a8x2", "w4a8x1", "fp16", "fp32")}
    for k in ts:
        run(k)
    for _ in range(reps):
        for k in ts:
            t0 = time.perf_counter()
            run(k)
            ts[k].append((time.perf_counter() - t0) * 1e3)
    res[M] = {k: round(sorted(v)[len(v) // 2], 2) for k, v in ts.items()}
    print(M, res[M], flush=True)
