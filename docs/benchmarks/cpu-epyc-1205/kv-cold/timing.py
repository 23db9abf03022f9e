"""The median of a call's wall time in us, after a warm-up (shared by the attention scripts)."""
import time


def bench(fn, n=400):
    for _ in range(20):
        fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2] * 1e6
