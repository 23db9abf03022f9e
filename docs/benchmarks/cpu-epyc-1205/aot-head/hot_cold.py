"""Shared by the ad hoc probes here: two rounds of two callables, each timed hot (median of
200 calls, ``benchmarks.quant._cpu_time_us``) and cold (median of 30 calls, each after a 256 MB
write), µs."""
import statistics
import time

import torch

from benchmarks.quant import _cpu_time_us

BIG = torch.randn(64 << 20)


def hot_cold(fns: dict) -> dict:
    """{name: fn} -> {name: [(hot, cold) per round]}."""
    res = {}
    for _ in range(2):
        for name, f in fns.items():
            hot = _cpu_time_us(f, 200)
            cold = []
            for _ in range(30):
                BIG.add_(1.0)
                t = time.perf_counter()
                f()
                cold.append(time.perf_counter() - t)
            res.setdefault(name, []).append((round(hot, 1),
                                             round(statistics.median(cold) * 1e6, 1)))
    return res
