"""The int4 layers' matmuls alone, one process: SmolLM2's 120 block matmuls (the file's Q4_1
codes) at M rows through torch's int4 kernel ("model"), the int4 x int8 op with one int8
part ("int8") and with two ("int8x2"), one whole pass over the 120 layers a sample (their
66 MB of codes do not stay in the caches between layers), the three in turn, the order
rotated every repetition. Per M: the median pass in ms and the relative error of each
against the float product of the layers' own dequantised weights (first pass's output).

    PYTHONPATH=. python docs/benchmarks/cpu-epyc-1206/int4-w4a8/matmuls.py [REPS] [ROWS]
"""
import json
import os
import statistics
import sys
import time

import torch
from common import keep_torch_packing, op_layers

from backend.layers import cpu_w4a8


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    rows = [int(r) for r in (sys.argv[2] if len(sys.argv) > 2 else "1,2,4,8,16").split(",")]
    keep_torch_packing()  # torch's kernel is timed on the same layers
    eng, layers = op_layers("int8")

    # each way's tensors bound once, as the engine's compiled pieces hold them
    bound = [(m.packed, m.group_size, m.scale_zero, m.w4a8_codes,
              m.w4a8_scale_min.view(torch.float16)) for m in layers]

    def torch_int4(b, x):
        return torch._weight_int4pack_mm_for_cpu(x, b[0], b[1], b[2])

    def op(parts):
        def call(b, x):
            return cpu_w4a8.matmul(x, b[3], b[4], parts)
        return call

    ways = {"model": torch_int4, "int8": op(1), "int8x2": op(2)}
    out = {"load_start": os.getloadavg(), "threads": torch.get_num_threads(),
           "layers": len(layers), "reps": reps, "rows": {}}
    gen = torch.Generator().manual_seed(0)
    for M in rows:
        xs = [torch.randn(M, m.in_features, generator=gen).to(torch.bfloat16) for m in layers]
        dense = [m.dequantized() for m in layers]
        ref = [x.double() @ w.double().t() for x, w in zip(xs, dense)]
        errors = {}
        for name, fn in ways.items():
            got = [fn(b, x) for b, x in zip(bound, xs)]
            errors[name] = statistics.median(
                ((g.double() - r).norm() / r.norm()).item() for g, r in zip(got, ref))
        times = {n: [] for n in ways}
        order = list(ways)
        with torch.inference_mode():
            for r in range(reps):
                for name in order[r % 3:] + order[:r % 3]:
                    fn = ways[name]
                    t0 = time.perf_counter()
                    for b, x in zip(bound, xs):
                        fn(b, x)
                    times[name].append((time.perf_counter() - t0) * 1e3)
        out["rows"][M] = {n: {"pass_ms": round(statistics.median(t), 3),
                              "rel_error": errors[n]} for n, t in times.items()}
        print(M, out["rows"][M], file=sys.stderr, flush=True)
    out["load_end"] = os.getloadavg()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
