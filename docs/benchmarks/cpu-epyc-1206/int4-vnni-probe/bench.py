"""Probe, not built into the engine: an int4 GEMM for few rows with the activations
quantised to int8 per block of 32 (as llama.cpp's q8_1) and AVX-512 VNNI products
(``int4_vnni.cpp``, 16 rows of codes interleaved per tile), against torch's
``_weight_int4pack_mm_for_cpu``: relative error against the float product, then 30 layers'
worth of SmolLM2's four matmuls (random codes) at 1 / 2 / 4 / 8 rows, alternating.

    flock /work/bench.lock .venv/bin/python docs/benchmarks/cpu-epyc-1206/int4-vnni-probe/bench.py
"""
import os
import statistics
import time

import torch
from torch.utils.cpp_extension import load

t0 = time.time()
ext = load("vnni_probe", [os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                       "int4_vnni.cpp")],
           extra_cflags=["-O3", "-march=native", "-fopenmp"], verbose=False)
print("build s", round(time.time() - t0, 1))
torch.manual_seed(0)
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # q|k|v, o, gate|up, down


def pack(codes, scale, mn):
    """codes [N, K] (0..15) -> [N/16, K/8, 16, 4] bytes (k and k + 4 in one byte), scales and
    mins [N/16, K/32, 16] fp16."""
    N, K = codes.shape
    c = codes.view(N // 16, 16, K // 8, 2, 4)
    packed = (c[:, :, :, 0] | (c[:, :, :, 1] << 4)).permute(0, 2, 1, 3).contiguous()
    s = scale.view(N // 16, 16, K // 32).permute(0, 2, 1).contiguous().half()
    m = mn.view(N // 16, 16, K // 32).permute(0, 2, 1).contiguous().half()
    return packed, s, m


layers = []
for _ in range(30):
    for N, K in SHAPES:
        codes = torch.randint(0, 16, (N, K), dtype=torch.uint8)
        scale = torch.rand(N, K // 32) * 0.02 + 0.001
        mn = -torch.rand(N, K // 32) * 0.1
        packed_t = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
        sz = torch.stack([scale, mn + 8 * scale], -1).transpose(0, 1).contiguous().bfloat16()
        layers.append(((N, K), codes, scale, mn, packed_t, sz, pack(codes, scale, mn)))


def rel(y, ref):
    return round(((y - ref).norm() / ref.norm()).item(), 5)


for (N, K), codes, scale, mn, pt, sz, (pc, ps, pm) in layers[:4]:
    for M in (1, 3, 8):
        x = torch.randn(M, K).bfloat16()
        W = codes.float() * scale.repeat_interleave(32, 1) + mn.repeat_interleave(32, 1)
        ref = x.float() @ W.t()
        a = torch._weight_int4pack_mm_for_cpu(x, pt, 32, sz).float()
        b = ext.gemv(x, pc, ps, pm).float()
        print(N, K, M, "torch rel", rel(a, ref), "vnni rel", rel(b, ref))


def passes(M):
    x, x2 = torch.randn(M, 576).bfloat16(), torch.randn(M, 1536).bfloat16()

    def torch_pass():
        for (N, K), *_rest, pt, sz, _p in layers:
            torch._weight_int4pack_mm_for_cpu(x if K == 576 else x2, pt, 32, sz)

    def vnni_pass():
        for (N, K), *_rest, (pc, ps, pm) in layers:
            ext.gemv(x if K == 576 else x2, pc, ps, pm)
    return torch_pass, vnni_pass


for M in (1, 2, 4, 8):
    ft, fv = passes(M)
    for _ in range(3):
        ft()
        fv()
    a, b = [], []
    for _ in range(15):
        t = time.perf_counter()
        ft()
        a.append(time.perf_counter() - t)
        t = time.perf_counter()
        fv()
        b.append(time.perf_counter() - t)
    print(f"M={M} 120 matmuls: torch {statistics.median(a) * 1e3:.2f} ms  "
          f"vnni {statistics.median(b) * 1e3:.2f} ms")
