"""The eager RoPE on the CPU: ``fused_ops.rope_signed_`` (the sine table's sign made once a
step) against the roll form it replaced, on SmolLM2's q|k heads (9 + 3 heads of 64) in a
qkv row, bf16, alternating, ROUNDS rounds; checks both give the same bits. One JSON line per
row count.

    PYTHONPATH=. python docs/benchmarks/cpu-epyc-1206/eager-step/rope_ab.py [ROUNDS]
"""
from __future__ import annotations

import json
import sys
import time

import torch

from backend.layers import fused_ops


def roll_form(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """The eager RoPE before: a rolled copy, its first half negated, two products, the sum."""
    half = qk.shape[-1] // 2
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rotated = qk.roll(half, -1)
    rotated[..., :half].neg_()
    torch.add(qk * cos, rotated * sin, out=qk)


def per_call_us(fn, qkv: torch.Tensor, calls: int) -> float:
    x = qkv.clone()
    heads = x[:, : 12 * 64].view(x.shape[0], 12, 64)
    for _ in range(20):
        fn(heads)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(heads)
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    torch.manual_seed(0)
    for rows in (1, 8, 512):
        qkv = torch.randn(rows, 15 * 64).bfloat16()
        cos, sin = torch.randn(rows, 64).bfloat16(), torch.randn(rows, 64).bfloat16()
        a, b = qkv.clone(), qkv.clone()
        roll_form(a[:, : 12 * 64].view(rows, 12, 64), cos, sin)
        fused_ops.rope_eager_(b[:, : 12 * 64].view(rows, 12, 64), cos, sin)
        signed = fused_ops.signed_sin(sin)
        calls = 2000 if rows < 512 else 500
        old, new = [], []
        for _ in range(rounds):
            old.append(per_call_us(lambda h: roll_form(h, cos, sin), qkv, calls))
            new.append(per_call_us(lambda h: fused_ops.rope_signed_(h, cos, signed), qkv, calls))
        print(json.dumps({"rows": rows, "same_bits": torch.equal(a, b),
                          "roll_us": [round(v, 1) for v in old],
                          "signed_us": [round(v, 1) for v in new]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
