"""The CPU paged decode kernel before and after, one call each, SmolLM2's heads (9 query, 3
KV, 64 dims), a float32 cache: agreement, then µs a call hot (one layer's cache again and
again) and cold (30 layers' caches in turn after 64 MiB written elsewhere, as in a step).
    PYTHONPATH=. python docs/benchmarks/cpu-avx2-1207/paged-decode-2/kernel.py OLD.so NEW.so
(OLD.so: ``git show facd3bf~1:backend/layers/csrc/paged_decode_cpu.cpp`` built with
``cpu_paged_decode.flags()``.) Prints one JSON line per context length."""
import json
import sys
import time

import torch

from backend.layers.cpu_paged_decode import PagedDecode

BS, LAYERS, REPS = 16, 30, 6


def hot(k, q, cache, tables, lens) -> float:
    for _ in range(20):
        k(q, cache, tables, lens, BS, 0.125)
    t = time.perf_counter()
    for _ in range(300):
        k(q, cache, tables, lens, BS, 0.125)
    return (time.perf_counter() - t) / 300 * 1e6


def cold(k, q, caches, tables, lens, big) -> float:
    spent = 0.0
    for _ in range(4):
        big.add_(1)  # the caches leave the CPU's caches
        t = time.perf_counter()
        for c in caches:
            k(q, c, tables, lens, BS, 0.125)
        spent += time.perf_counter() - t
    return spent / 4 / len(caches) * 1e6


def main() -> None:
    kernels = {"before": PagedDecode(sys.argv[1]), "after": PagedDecode(sys.argv[2])}
    torch.manual_seed(0)
    big = torch.empty(16 * 2**20)
    for ctx in (64, 256, 600, 1200):
        nb = (ctx + BS - 1) // BS + 4
        caches = [torch.randn(nb * BS, 2, 3, 64) for _ in range(LAYERS)]
        q = torch.randn(1, 9, 64)
        tables = torch.randperm(nb).to(torch.int32)[None]
        lens = torch.tensor([ctx], dtype=torch.int32)
        a, b = (kernels[n](q, caches[0], tables, lens, BS, 0.125) for n in kernels)
        row = {"context": ctx, "max_rel_diff": float((a - b).abs().max() / a.abs().max())}
        for name, k in kernels.items():
            row[name] = {"hot_us": [], "cold_us": []}
        for _ in range(REPS):  # alternating
            for name, k in kernels.items():
                row[name]["hot_us"].append(round(hot(k, q, caches[0], tables, lens), 1))
                row[name]["cold_us"].append(round(cold(k, q, caches, tables, lens, big), 1))
        for name in kernels:
            for key in ("hot_us", "cold_us"):
                v = sorted(row[name][key])
                row[name][key + "_median"] = v[len(v) // 2]
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
