"""Rounding inside Triton kernels that gives the same bits on the GPU, in the interpreter
and in torch: the quantising kernels (the KV cache's store, fp8 activations) round with
these before they convert, so the conversion itself has nothing left to round (Triton's
interpreter converts to float8 with another rounding than the GPU and torch)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rint(x):
    """Round half to even (as torch.round) for float32 |x| < 2^22: adding 1.5 * 2^23 leaves
    no fraction bits, so IEEE addition rounds there (to even), the same on the GPU and in
    the interpreter's numpy. Two additions: the store kernels round every value they
    write, and the floor-based rounding this replaced was a fifth of their instructions."""
    return (x + 12582912.0) - 12582912.0


@triton.jit
def round_to_e4m3(y):
    """|y| <= 448 -> the nearest float8_e4m3fn value (ties to even), still in float32."""
    a = tl.abs(y)
    expo = ((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127  # floor(log2 a) for a > 0
    expo = tl.maximum(expo, -6)  # below 2^-6 the format is subnormal: fixed 2^-9 steps
    step = ((expo - 3 + 127) << 23).to(tl.float32, bitcast=True)  # 2^(expo - 3)
    r = rint(a / step) * step
    return tl.where(y < 0, -r, r)
