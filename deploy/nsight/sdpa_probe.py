"""A self-contained attention workload for checking Nsight tooling on a machine.

Runs PyTorch SDPA (FlashAttention where the GPU supports it) in a fixed loop with fixed shapes,
inside one NVTX range, so `ncu_attention.sh` and `nsys_profile.sh` can be tried on a GPU before
the backend is profiled: it tells you whether the profiler may read the performance counters
(ERR_NVGPUCTRPERM, SYS_ADMIN, MIG) without a model or a server in the way.

    python deploy/nsight/sdpa_probe.py --iters 30 --batch 8 --seq 1024
"""
from __future__ import annotations

import argparse
import json
import time


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=30, help="measured SDPA calls (default 30)")
    p.add_argument("--warmup", type=int, default=5, help="SDPA calls before the NVTX range")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--seq", type=int, default=1024, help="query and key length")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--nvtx-range", default="infer:replay",
                   help="name of the NVTX range around the measured calls (capture trigger)")
    p.add_argument("--device", default="cuda")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import torch  # lazily: --help works without torch
    import torch.nn.functional as F

    args = _parse(argv)
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    gen = torch.Generator(device="cpu").manual_seed(0)
    shape = (args.batch, args.heads, args.seq, args.head_dim)
    # Fixed inputs, copied once: the loop below does no host-to-device traffic.
    q, k, v = (torch.randn(shape, generator=gen).to(args.device, dtype) for _ in range(3))
    for _ in range(args.warmup):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    _sync(args.device)
    use_nvtx = args.device.startswith("cuda")
    if use_nvtx:
        torch.cuda.nvtx.range_push(args.nvtx_range)
    t0 = time.perf_counter()
    for _ in range(args.iters):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    _sync(args.device)
    elapsed = time.perf_counter() - t0
    if use_nvtx:
        torch.cuda.nvtx.range_pop()
    flash = bool(use_nvtx and torch.backends.cuda.flash_sdp_enabled())
    print(json.dumps({"iters": args.iters, "shape": list(shape), "dtype": str(dtype),
                      "seconds": round(elapsed, 6), "flash_sdp_enabled": flash}))
    return 0


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


if __name__ == "__main__":
    raise SystemExit(main())
