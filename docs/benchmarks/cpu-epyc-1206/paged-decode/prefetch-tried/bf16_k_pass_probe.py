"""Ad hoc probe, kept for the record: the paged decode kernel built plain and with a
vdpbf16ps K pass (the change was reverted), 30 layers of random bf16 caches, caches evicted.

    PYTHONPATH=. python bf16_k_pass_probe.py PLAIN.so BF16.so
"""
import statistics
import sys
import time
from pathlib import Path

import torch

from backend.layers import cpu_paged_decode

libs = {n: cpu_paged_decode.PagedDecode(Path(p))
        for n, p in zip(("plain", "bf16"), sys.argv[1:3])}
torch.manual_seed(0)
L, kvh, g, hd, bs = 30, 3, 3, 64, 16
H = kvh * g
scale = hd ** -0.5
for D, C in ((1, 64), (1, 256), (1, 550), (8, 550), (8, 1000)):
    W = -(-C // bs)
    nb = D * W
    cache = torch.randn(L, nb * bs, 2, kvh, hd).bfloat16()  # consecutive blocks per sequence
    tables = torch.arange(nb).view(D, W).int()
    lens = torch.full((D,), C, dtype=torch.int32)
    qs = [torch.randn(D, H, hd).bfloat16() for _ in range(L)]
    a = libs["plain"](qs[0], cache[0], tables, lens, bs, scale).float()
    b = libs["bf16"](qs[0], cache[0], tables, lens, bs, scale).float()
    evict = torch.empty(64 * 2**20, dtype=torch.uint8)
    res = {n: [] for n in libs}
    for r in range(10):
        for n, k in libs.items():
            evict.add_(1)
            t = time.perf_counter()
            for layer in range(L):
                k(qs[layer], cache[layer], tables, lens, bs, scale)
            res[n].append(time.perf_counter() - t)
    diff = ((a - b).norm() / a.norm()).item()
    print(D, C, {n: round(statistics.median(v) * 1e3, 3) for n, v in res.items()},
          "rel diff", f"{diff:.1e}")
