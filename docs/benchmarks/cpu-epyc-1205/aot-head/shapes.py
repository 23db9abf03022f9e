"""Ad hoc: the one-row int8 GEMV compiled ahead of time (``backend.layers.cpu_aot``, built into
a temporary directory) against torch's ``_weight_int8pack_mm`` at SmolLM2's int8 shapes:
q|k|v, o, gate|up, down (as ``--weights-dtype int8`` would make them) and the LM head; bf16
x and scales, random codes. Per shape: compile seconds, relative error against torch's
kernel, then two rounds of (hot median over 200 calls, cold median over 30 calls each after
a 256 MB write), µs.

    PYTHONPATH=. python docs/benchmarks/cpu-epyc-1205/aot-head/shapes.py > shapes.log
"""
import os
import sys
import tempfile
from pathlib import Path

import torch

from backend.layers import cpu_aot

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hot_cold import hot_cold  # noqa: E402

torch.manual_seed(0)
print("torch", torch.__version__, "threads", torch.get_num_threads(),
      torch.backends.cpu.get_cpu_capability(), flush=True)
with tempfile.TemporaryDirectory() as tmp:
    for n, k in [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)]:
        q = torch.randint(-127, 127, (n, k), dtype=torch.int8)
        sc = (torch.rand(n) * 0.01).to(torch.bfloat16)
        x = torch.randn(1, k).to(torch.bfloat16)
        _, seconds = cpu_aot.build(Path(tmp), n, k, torch.bfloat16)
        kernel = cpu_aot.load(Path(tmp), n, k, torch.bfloat16)
        ref = torch._weight_int8pack_mm(x, q, sc).float()
        err = ((kernel(x, q, sc).float() - ref).abs().max() / ref.abs().max()).item()
        res = hot_cold({"torch": lambda: torch._weight_int8pack_mm(x, q, sc),
                        "aot": lambda: kernel(x, q, sc)})
        print(f"{n}x{k} compile {seconds:.1f} s, rel. err {err:.1e}, (hot, cold) us:", res,
              flush=True)
