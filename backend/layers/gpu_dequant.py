"""The dense weight of an int8 / int4 layer for calls with more tokens than the Triton
matmuls take (``linear.TRITON_MAX_M``: prefill chunks), on CUDA: written by one Triton pass
into a buffer from the caching allocator (the graph's pool when captured), then cuBLAS.

The torch expressions this replaces pass over the weight several times: for int4,
``quant_kernels.dequantize_int4`` writes the codes unpacked, widened, scaled and offset, four
full-size tensors (about 12 bytes moved per weight against 2.5 here); int8's
``q.to(dtype) * scale`` two (7 against 3). The values are the same to the bit: each product
is rounded to the weight's dtype before the min is added, as the torch expressions do
(fused multiply-adds are turned off for that). Off CUDA, or without Triton, the torch
expressions run.
"""
from __future__ import annotations

import torch

from backend.layers.launch import fast
from backend.layers.quant_kernels import INTERPRET, dequantize_int4

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None

BLOCK_N, BLOCK_COLS = 8, 512  # rows and packed bytes (int4) / codes (int8) per program

if triton is not None:
    @fast
    @triton.jit
    def _int4_dense_kernel(p_ptr, sm_ptr, w_ptr, N, K, G: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_J: tl.constexpr,
                           WHOLE_GROUPS: tl.constexpr):
        # packed [N, K/2] -> w [N, K]: byte j of a row holds column j (low nibble) and
        # column j + K/2 (high); scale_min [N, K/(2G), 4] (``quant_kernels``): group j of
        # the low half at 4 (N hg + j), its min next, then the high half's. w = round(q *
        # scale) + min.
        # WHOLE_GROUPS (G divides BLOCK_J and K/2): one scale and min load per group of the
        # tile, broadcast over its G columns; else one per element.
        half = K // 2
        hg = half // G
        NG: tl.constexpr = BLOCK_J // G  # groups per tile row (WHOLE_GROUPS)
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rj = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
        mask = (rn[:, None] < N) & (rj[None, :] < half)
        b = tl.load(p_ptr + rn[:, None] * half + rj[None, :], mask=mask, other=0).to(tl.int32)
        for hi in tl.static_range(2):
            col = rj + hi * half
            q = ((b >> (4 * hi)) & 15).to(tl.float32)
            if WHOLE_GROUPS:
                gi = tl.program_id(1) * NG + tl.arange(0, NG)  # group of the half
                gmask = (rn[:, None] < N) & (gi[None, :] < hg)
                sp = sm_ptr + (rn[:, None] * hg + gi[None, :]) * 4 + 2 * hi  # [BN, NG]
                s = tl.load(sp, mask=gmask, other=0.0)
                z = tl.load(sp + 1, mask=gmask, other=0.0)
                q3 = tl.reshape(q, (BLOCK_N, NG, G))
                prod = (q3 * s.to(tl.float32)[:, :, None]).to(s.dtype)  # torch's q * scale
                w = tl.reshape(prod.to(tl.float32) + z.to(tl.float32)[:, :, None],
                               (BLOCK_N, BLOCK_J))
            else:
                sp = sm_ptr + (rn[:, None] * hg + rj[None, :] // G) * 4 + 2 * hi
                s = tl.load(sp, mask=mask, other=0.0)
                z = tl.load(sp + 1, mask=mask, other=0.0)
                prod = (q * s.to(tl.float32)).to(s.dtype)  # rounded as torch's q * scale
                w = prod.to(tl.float32) + z.to(tl.float32)
            tl.store(w_ptr + rn[:, None] * K + col[None, :], w.to(w_ptr.dtype.element_ty),
                     mask=mask)

    @fast
    @triton.jit
    def _int8_dense_kernel(q_ptr, s_ptr, w_ptr, N, K, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr):
        # q [N, K] int8, scale [N] -> w [N, K] = round(q * scale)
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
        mask = (rn[:, None] < N) & (rk[None, :] < K)
        q = tl.load(q_ptr + rn[:, None] * K + rk[None, :], mask=mask, other=0)
        s = tl.load(s_ptr + rn, mask=rn < N, other=0.0)
        w = q.to(tl.float32) * s.to(tl.float32)[:, None]
        tl.store(w_ptr + rn[:, None] * K + rk[None, :], w.to(w_ptr.dtype.element_ty), mask=mask)


def _kernels(device: torch.device) -> bool:
    return triton is not None and (device.type == "cuda" or INTERPRET)


def _opts() -> dict:
    # no fused multiply-add: the product is rounded before the min is added (torch's order)
    return {} if INTERPRET else dict(num_warps=4, enable_fp_fusion=False)


def int4_dense(packed: torch.Tensor, scale_min: torch.Tensor, group_size: int) -> torch.Tensor:
    """[N, K] in scale_min's dtype from the packed int4 layout (``quant_kernels``); the values
    of ``quant_kernels.dequantize_int4``."""
    if not _kernels(packed.device):
        return dequantize_int4(packed, scale_min, group_size)
    N, half = packed.shape
    w = torch.empty(N, 2 * half, device=packed.device, dtype=scale_min.dtype)
    grid = (triton.cdiv(N, BLOCK_N), triton.cdiv(half, BLOCK_COLS))
    whole = BLOCK_COLS % group_size == 0 and half % group_size == 0
    _int4_dense_kernel[grid](packed, scale_min, w, N, 2 * half, G=group_size,
                             BLOCK_N=BLOCK_N, BLOCK_J=BLOCK_COLS, WHOLE_GROUPS=whole,
                             **_opts())
    return w


def int8_dense(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[N, K] in ``dtype``: q.to(dtype) * scale[:, None], scale in ``dtype``."""
    if not _kernels(q.device) or scale.dtype != dtype:
        return q.to(dtype) * scale.to(dtype).unsqueeze(1)
    N, K = q.shape
    w = torch.empty(N, K, device=q.device, dtype=dtype)
    grid = (triton.cdiv(N, BLOCK_N), triton.cdiv(K, BLOCK_COLS))
    _int8_dense_kernel[grid](q, scale, w, N, K, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_COLS, **_opts())
    return w
