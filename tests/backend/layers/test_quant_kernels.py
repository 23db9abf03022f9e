"""The CUDA Triton kernels, run by Triton's interpreter on the CPU (tiny shapes): GEMV and
GEMM for int8 and int4 against the dequantised reference, and the int4 packing."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from backend.layers import quant_kernels
from backend.layers.quantize import quantize_int4

pytest.importorskip("triton")

_CHECK = textwrap.dedent("""
    import torch
    from backend.layers import quant_kernels as qk
    from backend.layers.quantize import quantize_int4, quantize_int8
    assert qk.AVAILABLE
    gen = torch.Generator().manual_seed(0)
    N, K, G = 48, 128, 32
    w = torch.randn(N, K, generator=gen) * 0.1
    q, s = quantize_int8(w)
    g = quantize_int4(w, G)
    packed = qk.pack_int4(g.codes)
    ref8 = q.float() * s[:, None]
    ref4 = g.dequantize()
    for M in (1, 3, 20):
        x = torch.randn(M, K, generator=gen)
        y8 = qk.int8_matmul(x, q, s)
        y4 = qk.int4_matmul(x, packed, g.scale, g.min, G)
        torch.testing.assert_close(y8, x @ ref8.t(), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(y4, x @ ref4.t(), atol=1e-4, rtol=1e-4)
    print("ok")
""")


def test_triton_kernels_match_reference_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", _CHECK], env=env, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_int4_packing_round_trips():
    g = quantize_int4(torch.randn(8, 64), 32)
    packed = quant_kernels.pack_int4(g.codes)
    assert packed.shape == (8, 32) and packed.dtype == torch.uint8
    back = quant_kernels.dequantize_int4(packed, g.scale, g.min, 32)
    torch.testing.assert_close(back, g.dequantize())
