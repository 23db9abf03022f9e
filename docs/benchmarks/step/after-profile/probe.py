"""Host time of eager GPU work before and after one profiler capture in the same process.

    python docs/benchmarks/step/after-profile/probe.py MODE [OUT.json]

MODE: ``cuda`` (a StepProfiler capture with CUDA activities, as the ablation's rows and
POST /debug/profile take), ``cpu`` (CPU activities only), ``warm`` (the profiler's one-time
start and stop alone, as a server with --enable-profiling does at start-up) or ``none``.
Timed: a torch elementwise op and one of our Triton kernels on a small tensor, launched
back to back with no sync (the host is the bottleneck: the GPU work is a few us), the median
of seven rounds of 2,000 launches, before and after. Without CUDA it times the torch op on
the CPU (20,000 calls a round) and captures CPU activities (modes cuda and cpu alike). On
a GPU, run it as torch leaves Kineto and with TEARDOWN_CUPTI=1 in the environment (Kineto
then releases CUPTI when a capture stops). The row says how many kernels a step the capture
recorded: with TEARDOWN_CUPTI=1 the ablation's captures on an H100 recorded none.
"""
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from backend.layers.fused_ops import silu_mul_triton
from backend.profiling.capture import CaptureJob, StepProfiler

N, ROUNDS = 2000, 7


CUDA = torch.cuda.is_available()


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def per_launch_us(fn, n: int) -> float:
    samples = []
    for _ in range(ROUNDS):
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        sync()
        samples.append((t1 - t0) / n * 1e6)
    return statistics.median(samples)


def timings(x: torch.Tensor, gu: torch.Tensor) -> dict:
    out = {"torch_mul_us": round(per_launch_us(lambda: x.mul(1.0001), N if CUDA else 10 * N), 3)}
    if CUDA:
        out["triton_silu_mul_us"] = round(per_launch_us(lambda: silu_mul_triton(gu), N), 3)
    return out


def capture(cuda: bool, x: torch.Tensor) -> dict | BaseException | None:
    """One capture as the server takes it; its report (or the error it ended with)."""
    prof, done, got = StepProfiler(), threading.Event(), []
    prof.warm(cuda)
    prof.start(CaptureJob(3, Path(tempfile.mkdtemp()), lambda r: (got.append(r), done.set()),
                          name="probe", cuda=cuda and CUDA))
    for _ in range(5):
        if not prof.busy:
            break
        prof.run_step(lambda: [x.mul(1.0001) for _ in range(50)])
    prof.stop_early()
    done.wait(120)
    return got[0] if got else None


def main() -> None:
    mode = sys.argv[1]
    dev = "cuda" if CUDA else "cpu"
    x = torch.randn(8, 256, device=dev, dtype=torch.bfloat16)
    gu = torch.randn(8, 2 * 4096, device=dev, dtype=torch.bfloat16)
    timings(x, gu)  # compile and warm
    before = timings(x, gu)
    report = None
    if mode in ("cuda", "cpu"):
        report = capture(mode == "cuda", x)
    elif mode == "warm":
        StepProfiler().warm(CUDA)
    after = timings(x, gu)
    # kernels_per_step: what the capture recorded (None: no GPU activity, see reason; no
    # capture in modes none and warm; reason is the error where the capture ended in one)
    summary = report if isinstance(report, dict) else {}
    row = {"mode": mode, "TEARDOWN_CUPTI": os.environ.get("TEARDOWN_CUPTI"),
           "kernels_per_step": summary.get("kernels_per_step"),
           "reason": summary.get("reasons", {}).get("kernels_per_step") if summary
           else report and repr(report),
           "before": before, "after": after,
           "device": torch.cuda.get_device_name() if CUDA else "cpu"}
    print(json.dumps(row), flush=True)
    if len(sys.argv) > 2:
        with open(sys.argv[2], "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
