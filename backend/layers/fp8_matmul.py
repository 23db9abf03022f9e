"""fp8 (e4m3) matmuls: weights with one scale per output row, activations quantised per
row (token) on the fly, both multiplied on the tensor cores by ``torch._scaled_mm``
(cuBLASLt on CUDA, compute capability 8.9+; torch's reference kernel on the CPU).

On an H200 the fp8 layer runs Llama-2-7B's prefill-sized layers 1.23-1.64x faster than
bf16 cuBLAS (docs/BENCHMARKS.md, "fp8 weights"): prefill is bound by the matmul rate, and
the fp8 rate is twice bf16's. ``quantize_rows`` is the extra pass: a row's largest |x| sets
its scale (amax / 448, 448 being e4m3's largest value), every value is rounded to e4m3
against it. One Triton program per row on CUDA (and under ``TRITON_INTERPRET=1``), the same
arithmetic in torch ops elsewhere: the same bits in the interpreter; on the GPU, whose
float32 division is approximate, a code in a few thousand may land one step away. The step
ops' norm and SiLU·mul kernels end in ``store_e4m3_row`` themselves, so in a Triton step
only the attention output goes through the extra pass.
"""
from __future__ import annotations

import os

import torch

from backend.layers import pdl
from backend.layers.launch import fast
from backend.layers.quantize import FP8_AMAX_FLOOR, FP8_MAX, quantize_fp8

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the torch path below needs no Triton
    triton = None

FP8 = torch.float8_e4m3fn
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

if triton is not None:
    from backend.layers.pdl import release as pdl_release
    from backend.layers.pdl import wait as pdl_wait
    from backend.layers.rounding import round_to_e4m3

    _MAX_C = tl.constexpr(FP8_MAX)  # kernels read module constants only as constexprs
    _FLOOR_C = tl.constexpr(FP8_AMAX_FLOOR)

    @triton.jit
    def store_e4m3_row(q_ptr, s_ptr, row, stride_q, cols, mask, x):
        """One whole row x [BLOCK] (float32, zeros where masked) -> its e4m3 codes (as
        bytes) at row ``row`` of q and its scale at s[row]. Shared with the step ops'
        kernels that end in a row the next matmul takes in fp8 (norm, SiLU·mul)."""
        amax = tl.maximum(tl.max(tl.abs(x), axis=0), _FLOOR_C)
        q = round_to_e4m3(x * (_MAX_C / amax))
        tl.store(q_ptr + row * stride_q + cols, q.to(tl.float8e4nv).to(tl.uint8, bitcast=True),
                 mask=mask)
        tl.store(s_ptr + row, amax / _MAX_C)

    @fast
    @triton.jit
    def _quantize_rows_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, stride_q,
                              BLOCK: tl.constexpr, PDL: tl.constexpr):
        # one program per row; the whole row (K <= BLOCK) lives in registers
        pdl_wait(PDL)
        pdl_release(PDL)
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < K
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        store_e4m3_row(q_ptr, s_ptr, row, stride_q, cols, mask, x)


def _kernel_runs(x: torch.Tensor) -> bool:
    return triton is not None and (x.is_cuda or (INTERPRET and x.device.type == "cpu"))


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] float -> (codes [M, K] float8_e4m3fn, scale [M, 1] float32) with
    x ~ codes * scale, one scale per row."""
    M, K = x.shape
    if not _kernel_runs(x):
        codes, scale = quantize_fp8(x)  # the weights' quantiser: rows are rows
        return codes, scale.unsqueeze(1)
    q, s = new_codes(M, K, x.device)
    block = triton.next_power_of_2(K)
    opts = {} if INTERPRET else dict(num_warps=min(16, max(4, block // 1024)))
    _quantize_rows_kernel[(M,)](x, q, s, K, x.stride(0), q.stride(0), BLOCK=block, **opts,
                                **pdl.launch(x.device))
    return q.view(FP8), s


def new_codes(rows: int, cols: int, device: torch.device
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty (codes as bytes [rows, cols], scales [rows, 1] float32) for a kernel to fill."""
    return (torch.empty(rows, cols, dtype=torch.uint8, device=device),
            torch.empty(rows, 1, dtype=torch.float32, device=device))


def supported(out_features: int, in_features: int) -> bool:
    """Whether ``scaled_matmul`` takes a weight of this shape (cuBLASLt's fp8 matmuls want
    both widths in multiples of 16)."""
    return out_features % 16 == 0 and in_features % 16 == 0


def scaled_matmul(x: torch.Tensor, codes: torch.Tensor, scale_row: torch.Tensor
                  ) -> torch.Tensor:
    """x [M, K] (model dtype) @ (codes [N, K] e4m3 * scale_row [1, N] float32).T -> [M, N]
    in x's dtype."""
    xq, xs = quantize_rows(x)
    return codes_matmul(xq, xs, codes, scale_row, x.dtype)


def codes_matmul(xq: torch.Tensor, xs: torch.Tensor, codes: torch.Tensor,
                 scale_row: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(xq [M, K] e4m3 * xs [M, 1]) @ (codes [N, K] * scale_row [1, N]).T -> [M, N] in
    ``dtype``. CUDA's row-wise scaled matmul writes bf16 only: other dtypes are converted
    from it."""
    out_dtype = torch.bfloat16 if xq.is_cuda else dtype
    y = torch._scaled_mm(xq, codes.t(), scale_a=xs, scale_b=scale_row, out_dtype=out_dtype)
    return y if y.dtype == dtype else y.to(dtype)
