"""SmolLM2's LM head alone (49,152 x 576): the int8 rows kernel against fbgemm's fp16 GEMM
on the same weights, cold (64 MiB written elsewhere before each call), alternating, 12 calls
each a row count; ms medians.
    PYTHONPATH=. python docs/benchmarks/cpu-avx2-1207/paged-decode-2/head.py DIR
(DIR: where ``cpu_int8_rows.build`` put the library). Prints one JSON line per row count."""
import json
import sys
import time

import torch

from backend.layers import cpu_int8_rows

N, K, CALLS = 49152, 576, 12


def main() -> None:
    kernel = cpu_int8_rows.load(sys.argv[1])
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=gen)
    scale = torch.rand(N, generator=gen) * 0.01
    packed = torch.ops.quantized.linear_prepack_fp16(q.float() * scale[:, None], None)
    big = torch.empty(16 * 2**20)
    for rows in (1, 2, 4, 8, 16, 64):
        x = torch.randn(rows, K, generator=gen)
        calls = {"int8_rows": lambda: kernel(x, q, scale),
                 "fbgemm_fp16": lambda: torch.ops.quantized.linear_dynamic_fp16(x, packed)}
        ms = {name: [] for name in calls}
        for _ in range(CALLS):
            for name, fn in calls.items():
                big.add_(1)
                t = time.perf_counter()
                fn()
                ms[name].append((time.perf_counter() - t) * 1e3)
        print(json.dumps({"rows": rows, **{f"{n}_ms_median": round(sorted(v)[CALLS // 2], 3)
                                           for n, v in ms.items()}}), flush=True)


if __name__ == "__main__":
    main()
