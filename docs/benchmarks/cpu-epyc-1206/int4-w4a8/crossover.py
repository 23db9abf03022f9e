"""Where the kept dense copies should take over from the int4 x int8 op: SmolLM2's 120 int4
block matmuls (the file's Q4_1 codes) at M rows through the op (``int8x2``) and through the
kept bf16 copies reordered for oneDNN (``copy``, what steps of ``COPY_MIN_ROWS["int4"]``
rows and more take), one whole pass over the 120 layers a sample (their codes and copies
do not stay in the caches between layers), the two in turn, the order swapped every
repetition. Per M: the median pass in ms of each.

    PYTHONPATH=. python docs/benchmarks/cpu-epyc-1206/int4-w4a8/crossover.py [REPS] [ROWS] \
        > OUT.json
"""
import json
import os
import statistics
import sys
import time

import torch
from common import op_layers

from backend.layers import cpu_w4a8


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    rows = [int(r) for r in (sys.argv[2] if len(sys.argv) > 2 else "8,12,16,24,32").split(",")]
    eng, layers = op_layers("int8x2", copies=True)

    def op(m, x):
        return cpu_w4a8.matmul(x, m.w4a8_codes, m.w4a8_scale_min.view(torch.float16), 2)

    def copy(m, x):
        return m.copy_matmul(x)

    ways = {"int8x2": op, "copy": copy}
    out = {"load_start": os.getloadavg(), "threads": torch.get_num_threads(),
           "copy_kernel": layers[0].prefill_kernel(), "layers": len(layers), "reps": reps,
           "rows": {}}
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for M in rows:
            xs = [torch.randn(M, m.in_features, generator=gen).to(torch.bfloat16)
                  for m in layers]
            times = {n: [] for n in ways}
            for r in range(reps):
                for name in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
                    fn = ways[name]
                    t0 = time.perf_counter()
                    for m, x in zip(layers, xs):
                        fn(m, x)
                    times[name].append((time.perf_counter() - t0) * 1e3)
            out["rows"][M] = {n: round(statistics.median(t), 3) for n, t in times.items()}
            print(M, out["rows"][M], file=sys.stderr, flush=True)
    out["load_end"] = os.getloadavg()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
