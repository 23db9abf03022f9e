"""Ad hoc probe: the one-row int4 g32 GEMV as inductor compiles it ahead of time from a plain
expression, against torch._weight_int4pack_mm_for_cpu, at SmolLM2's int4 shapes; random
codes, bf16. LAYOUT: interleaved (byte j holds columns 2j and 2j + 1: nibbles unpacked by a
stack) or halves (byte j holds columns j and K/2 + j: no interleaving). Per shape: compile
seconds, max error of each against the exact product, then two rounds of (hot median over 200
calls, cold median over 30 calls each after a 256 MB write), µs.

    PYTHONPATH=. python docs/benchmarks/cpu-epyc-1205/aot-head/int4_probe.py interleaved|halves
"""
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hot_cold import hot_cold  # noqa: E402

G = 32


class Interleaved(torch.nn.Module):
    def forward(self, x, codes, scale, zero):  # x [1, K]; codes [N, K/2]; scale, zero [N, K/G]
        N, K = codes.shape[0], x.shape[1]
        lo = (codes & 15).to(torch.float32)
        hi = (codes >> 4).to(torch.float32)
        q = torch.stack([lo, hi], dim=-1).view(N, K // G, G)
        w = q * scale.to(torch.float32).unsqueeze(-1) + zero.to(torch.float32).unsqueeze(-1)
        y = (w * x.to(torch.float32).view(1, K // G, G)).sum((-1, -2))
        return y.to(x.dtype).unsqueeze(0)


class Halves(torch.nn.Module):
    def forward(self, x, codes, scale, zero):
        N, H = codes.shape
        xf = x.to(torch.float32).view(2, H // G, G)
        lo = (codes & 15).to(torch.float32).view(N, H // G, G)
        hi = (codes >> 4).to(torch.float32).view(N, H // G, G)
        s = scale.to(torch.float32).view(N, 2, H // G)
        z = zero.to(torch.float32).view(N, 2, H // G)
        xs = xf.sum(-1)  # [2, H/G]
        y = ((lo * xf[0]).sum(-1) * s[:, 0] + (hi * xf[1]).sum(-1) * s[:, 1]
             + xs[0] * z[:, 0] + xs[1] * z[:, 1]).sum(-1)
        return y.to(x.dtype).unsqueeze(0)


LAYOUTS = {"interleaved": (Interleaved, lambda qi: qi[:, 0::2] | (qi[:, 1::2] << 4)),
           "halves": (Halves, lambda qi: qi[:, : qi.shape[1] // 2] | (qi[:, qi.shape[1] // 2:] << 4))}
module_cls, pack = LAYOUTS[sys.argv[1]]
torch.manual_seed(0)
tmp = tempfile.mkdtemp()
for N, K in [(960, 576), (576, 576), (3072, 576), (576, 1536)]:
    qi = torch.randint(0, 16, (N, K), dtype=torch.int32)
    codes = pack(qi).to(torch.uint8)
    scale = (torch.rand(N, K // G) * 0.01).to(torch.bfloat16)
    zero = (-8 * scale.float()).to(torch.bfloat16)
    x = torch.randn(1, K).to(torch.bfloat16)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(qi, 1)
    sz = torch.stack([scale.float(), zero.float() + 8 * scale.float()], -1) \
        .transpose(0, 1).contiguous().to(torch.bfloat16)
    t = time.perf_counter()
    ep = torch.export.export(module_cls(), (x, codes, scale, zero))
    p = torch._inductor.aoti_compile_and_package(ep, package_path=f"{tmp}/i4_{N}x{K}.pt2")
    tc = time.perf_counter() - t
    run = torch._C._aoti.AOTIModelPackageLoader(p, "model", False, 1, -1).run
    ref = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, G, sz).float()
    got = run([x, codes, scale, zero])[0].float()
    w = (qi.float().view(N, K // G, G) * scale.float().unsqueeze(-1)
         + zero.float().unsqueeze(-1)).view(N, K)
    exact = x.float() @ w.t()
    e1 = ((got - exact).abs().max() / exact.abs().max()).item()
    e2 = ((ref - exact).abs().max() / exact.abs().max()).item()
    res = hot_cold({"torch": lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(
                        x, packed, G, sz),
                    "aot": lambda: run([x, codes, scale, zero])})
    print(f"{N}x{K} compile {tc:.1f}s err aot {e1:.1e} torch {e2:.1e}", res, flush=True)
