"""GPU benchmark of the fp8 linear layer (``--weights-dtype fp8``) against bf16 cuBLAS on
Llama-2-7B's layer shapes (synthetic weights), by tokens per call M:

* M = 1: the one-token GEMV over the e4m3 codes (weight-only, what a batch-1 decode step
  runs) against bf16 ``F.linear``;
* M > 1: the whole fp8 layer call, the activations' row quantiser included, then
  ``torch._scaled_mm``, against bf16 ``F.linear``.

Weights are rotated past L2 (``benchmarks.quant.time_rotating``), calls replayed from a CUDA
graph. Reported: µs per call, TFLOP/s, weight GB/s, and each format's error against the
float product.

    python -m benchmarks.fp8_matmul --json out.json [--tokens 1,64,512,1024,2048]
"""
from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from backend.layers.gemv import Prologue
from backend.layers.linear import LinearRows, WeightFormat, make_linear
from benchmarks.quant import SHAPES_7B, copies_past_l2, time_rotating


def _one_token(layer, x: torch.Tensor) -> torch.Tensor:
    return layer.one_token(x, Prologue())[0]


def bench(tokens: list[int]) -> list[dict]:
    dev = torch.device("cuda")
    rows = []
    for name, N, K in SHAPES_7B:
        copies = copies_past_l2(N * K * 2)
        dense, fp8 = [], []
        for i in range(copies):
            w = torch.randn(N, K, device=dev, generator=torch.Generator(dev).manual_seed(i))
            w = (w * 0.02).to(torch.bfloat16)
            dense.append(w)
            layer = make_linear(WeightFormat("fp8"), N, K, False, dev, torch.bfloat16)
            LinearRows(layer).load(w)
            fp8.append(layer)
        for M in tokens:
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            exact = x.float() @ dense[0].float().t()
            call = _one_token if M == 1 else (lambda layer, x: layer(x))
            y = call(fp8[0], x).float()
            err = ((y - exact).norm() / exact.norm()).item()
            bf16_us = time_rotating([partial(F.linear, x, w) for w in dense], dev)
            fp8_us = time_rotating([partial(call, layer, x) for layer in fp8], dev)
            flop = 2 * M * N * K
            rows.append({"shape": name, "N": N, "K": K, "M": M,
                         "fp8_kernel": fp8[0].one_token_kernel(True) if M == 1
                         else fp8[0].kernel,
                         "bf16_us": round(bf16_us, 2), "fp8_us": round(fp8_us, 2),
                         "speedup": round(bf16_us / fp8_us, 3),
                         "bf16_tflop_s": round(flop / bf16_us / 1e6, 1),
                         "fp8_tflop_s": round(flop / fp8_us / 1e6, 1),
                         "bf16_weight_gb_s": round(N * K * 2 / bf16_us / 1e3, 1),
                         "fp8_weight_gb_s": round(N * K * 1 / fp8_us / 1e3, 1),
                         "fp8_rel_err_vs_float": round(err, 5)})
            print(rows[-1], flush=True)
        del dense, fp8
        torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--tokens", default="1,64,512,1024,2048")
    args = ap.parse_args(argv)
    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "rows": bench([int(t) for t in args.tokens.split(",")])}
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")
    print(f"{'layer':8} {'M':>5} {'bf16 us':>9} {'fp8 us':>9} {'x':>6}")
    for r in res["rows"]:
        print(f"{r['shape']:8} {r['M']:5} {r['bf16_us']:9.1f} {r['fp8_us']:9.1f} "
              f"{r['speedup']:6.2f}")


if __name__ == "__main__":
    main()
