"""The median of a call's wall time in us after 20 warm-up calls (shared by the attention
scripts; the timing itself is ``benchmarks.quant``'s)."""
from benchmarks.quant import _cpu_time_us


def bench(fn, n=400):
    for _ in range(19):  # _cpu_time_us makes the twentieth
        fn()
    return _cpu_time_us(fn, n)
