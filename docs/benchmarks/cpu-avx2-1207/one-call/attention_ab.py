"""The attention of a batch-1 decode step over SmolLM2's 30 layers (context 550, float32
cache, the paged decode kernel built in the weights cache), the two ways alternating in one
process, ms a step (medians of 15 rounds of 20 steps):
- step: ``Attention.prepare`` sets the step up once, each layer is one C call that stores
  the layer's K/V and attends (``PagedDecode.step``);
- before: each layer's ``KVCache.write`` (two ``index_copy_``) then the kernel's call.
    PYTHONPATH=. python docs/benchmarks/cpu-avx2-1207/one-call/attention_ab.py [CONTEXT]"""
import json
import statistics as st
import sys
import time

import torch

from backend.engine.aot_kernels import kernels_dir
from backend.layers import cpu_paged_decode
from backend.layers.attention import Attention, AttentionMetadata
from backend.layers.kv_cache import KVCache

torch.set_num_threads(2)
L, bs, kvh, hd, H = 30, 16, 3, 64, 9
ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 550
cache = KVCache(L, 64, bs, kvh, hd, torch.float32, "auto", torch.device("cpu"),
                kernel_layout=False)
cache.data.normal_()
lib = cpu_paged_decode.load(kernels_dir())
assert lib is not None, "no paged decode kernel: make model"
attn = Attention(H, kvh, hd, "sdpa", cache)
attn.cpu_decode = lib
tables = torch.arange(40, dtype=torch.int32)[None]
lens = torch.tensor([ctx], dtype=torch.int32)
slot = torch.tensor([ctx - 1])
wide = torch.randn(1, H + 2 * kvh, hd)  # the step's q|k|v output, q, k and v its views
q, k, v = wide[:, :H], wide[:, H:H + kvh], wide[:, H + kvh:]


def step() -> None:
    meta = AttentionMetadata(slot, tables, lens, torch.arange(2, dtype=torch.int32),
                             num_decode=1, max_decode_context=ctx, min_decode_context=ctx)
    attn.prepare(meta)
    for i in range(L):
        attn.forward(i, q, k, v, meta)


def before() -> None:
    for i in range(L):
        cache.write(i, slot, k, v)
        lib(q.contiguous(), cache.data[i], tables[:1], lens[:1], bs, attn.scale)


ms = {"step": [], "before": []}
for f in (step, before):
    for _ in range(20):
        f()
for _ in range(15):
    for name, f in (("step", step), ("before", before)):
        t = time.perf_counter()
        for _ in range(20):
            f()
        ms[name].append(round((time.perf_counter() - t) / 20 * 1e3, 3))
print(json.dumps({"context": ctx, "ms_per_step": ms,
                  "median": {k: st.median(v) for k, v in ms.items()},
                  "ratio_median": round(st.median(a / b for a, b in zip(ms["step"],
                                                                         ms["before"])), 3)}))
