"""Triton kernels for weight-only int8 / int4 matmuls on CUDA (decode: one token to a few
dozen per step), plus the int4 packing they read and a torch dequantiser.

Layouts:
  * int8: q [N, K] int8, scale [N] (model dtype); y = (x @ q.T) * scale.
  * int4: packed [N, K / 2] uint8 with packed[n, j] = code[n, j] | code[n, j + K/2] << 4 (the
    two halves of a row share a byte, so one contiguous tile of bytes feeds two contiguous
    tiles of x); scale / min [N, K / G] (model dtype); W = code * scale + min.

``int8_matmul`` / ``int4_matmul`` pick a GEMV (one row of x: a reduction per output, fp32
accumulate) or a tl.dot GEMM that dequantises each weight tile in registers (several rows).
Both read each weight byte once per call, so decode moves 1/2 (int8) or ~1/4 (int4) of bf16's
weight bytes. Under ``TRITON_INTERPRET=1`` they run on CPU tensors (the tests do that).
"""
from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the CPU packed ops need no Triton
    triton = None

AVAILABLE = triton is not None and (torch.cuda.is_available()
                                    or os.environ.get("TRITON_INTERPRET") == "1")


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """codes [N, K] (0..15) -> [N, K / 2] uint8, low nibble = column j, high = j + K/2."""
    half = codes.shape[1] // 2
    c = codes.to(torch.uint8)
    return (c[:, :half] | (c[:, half:] << 4)).contiguous()


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor, lo: torch.Tensor,
                    group_size: int) -> torch.Tensor:
    """[N, K] in scale's dtype from the packed layout (large-batch path and tests)."""
    codes = torch.cat((packed & 15, packed >> 4), dim=1)  # [N, K] uint8
    N, K = codes.shape
    g = codes.view(N, K // group_size, group_size).to(scale.dtype)
    return (g * scale.unsqueeze(-1) + lo.unsqueeze(-1)).view(N, K)


INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _configs(params: list[dict], warps: list[int], stages: int = 3) -> list:
    """Autotuning candidates (the interpreter runs the first only: it checks values, and
    timing it means nothing)."""
    configs = [triton.Config(p, num_warps=w, num_stages=stages) for p, w in zip(params, warps)]
    return configs[:1] if INTERPRET else configs


if triton is not None:
    _GEMV8 = _configs([dict(BLOCK_N=16, BLOCK_K=512), dict(BLOCK_N=8, BLOCK_K=512),
                       dict(BLOCK_N=32, BLOCK_K=256), dict(BLOCK_N=16, BLOCK_K=1024),
                       dict(BLOCK_N=64, BLOCK_K=128), dict(BLOCK_N=4, BLOCK_K=1024)],
                      [4, 4, 4, 8, 4, 4])
    # int4: BLOCK_K bytes = GROUPS groups of G columns from each half of a row.
    _GEMV4 = _configs([dict(BLOCK_N=16, GROUPS=4), dict(BLOCK_N=8, GROUPS=8),
                       dict(BLOCK_N=32, GROUPS=2), dict(BLOCK_N=16, GROUPS=8),
                       dict(BLOCK_N=64, GROUPS=1), dict(BLOCK_N=4, GROUPS=8)],
                      [4, 4, 4, 8, 4, 4])
    _GEMM8 = _configs([dict(BLOCK_N=64, BLOCK_K=128), dict(BLOCK_N=32, BLOCK_K=128),
                       dict(BLOCK_N=128, BLOCK_K=64), dict(BLOCK_N=32, BLOCK_K=256),
                       dict(BLOCK_N=64, BLOCK_K=256)], [4, 4, 4, 4, 8], stages=3)
    # Two pipeline stages: a tile of G=128 groups with x for both halves fills shared memory.
    _GEMM4 = _configs([dict(BLOCK_N=64, GROUPS=1), dict(BLOCK_N=32, GROUPS=2),
                       dict(BLOCK_N=128, GROUPS=1), dict(BLOCK_N=32, GROUPS=1),
                       dict(BLOCK_N=64, GROUPS=2)], [4, 4, 4, 4, 8], stages=2)

    @triton.autotune(configs=_GEMV8, key=["N", "K"])
    @triton.jit
    def _int8_gemv(x_ptr, w_ptr, s_ptr, y_ptr, N, K,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # y[n] = scale[n] * sum_k x[k] * q[n, k]; one program per BLOCK_N outputs.
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + rk
            x = tl.load(x_ptr + k, mask=k < K, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + rn[:, None] * K + k[None, :],
                        mask=(rn[:, None] < N) & (k[None, :] < K), other=0)
            acc += w.to(tl.float32) * x[None, :]
        s = tl.load(s_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
        y = tl.sum(acc, axis=1) * s
        tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=rn < N)

    @triton.autotune(configs=_GEMM8, key=["N", "K", "M_BUCKET"])
    @triton.jit
    def _int8_gemm(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, M_BUCKET,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # y[m, n] = scale[n] * sum_k x[m, k] q[n, k]; weight tiles dequantised in registers.
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + rk
            x = tl.load(x_ptr + rm[:, None] * K + k[None, :],
                        mask=(rm[:, None] < M) & (k[None, :] < K), other=0.0)
            w = tl.load(w_ptr + rn[None, :] * K + k[:, None],
                        mask=(rn[None, :] < N) & (k[:, None] < K), other=0)  # [BK, BN]
            acc = tl.dot(x, w.to(x.dtype), acc)
        s = tl.load(s_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
        y = acc * s[None, :]
        tl.store(y_ptr + rm[:, None] * N + rn[None, :], y.to(y_ptr.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))

    @triton.autotune(configs=_GEMV4, key=["N", "K", "G"])
    @triton.jit
    def _int4_gemv(x_ptr, p_ptr, s_ptr, z_ptr, y_ptr, N, K,
                   G: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr):
        # Byte j of a row holds columns j (low nibble) and j + K/2 (high nibble). Per group:
        # sum_k (q s + m) x = s * sum_k q x + m * sum_k x, so scales load once per group.
        BLOCK_K: tl.constexpr = GROUPS * G
        half = K // 2
        ng = K // G
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        rg = tl.arange(0, GROUPS)
        nmask = rn[:, None] < N
        acc = tl.zeros((BLOCK_N, GROUPS), dtype=tl.float32)
        for j0 in range(0, half, BLOCK_K):
            j = j0 + rk
            jm = j < half
            b = tl.load(p_ptr + rn[:, None] * half + j[None, :], mask=nmask & jm[None, :],
                        other=0)  # [BN, BK] uint8
            x_lo = tl.load(x_ptr + j, mask=jm, other=0.0).to(tl.float32)
            x_hi = tl.load(x_ptr + half + j, mask=jm, other=0.0).to(tl.float32)
            qx_lo = tl.sum(tl.reshape((b & 15).to(tl.float32) * x_lo[None, :],
                                      (BLOCK_N, GROUPS, G)), axis=2)  # [BN, GROUPS]
            qx_hi = tl.sum(tl.reshape((b >> 4).to(tl.float32) * x_hi[None, :],
                                      (BLOCK_N, GROUPS, G)), axis=2)
            xs_lo = tl.sum(tl.reshape(x_lo, (GROUPS, G)), axis=1)  # [GROUPS]
            xs_hi = tl.sum(tl.reshape(x_hi, (GROUPS, G)), axis=1)
            g_lo = j0 // G + rg
            g_hi = (j0 + half) // G + rg
            gm = nmask & (g_lo[None, :] < half // G)
            s_lo = tl.load(s_ptr + rn[:, None] * ng + g_lo[None, :], mask=gm, other=0.0)
            z_lo = tl.load(z_ptr + rn[:, None] * ng + g_lo[None, :], mask=gm, other=0.0)
            s_hi = tl.load(s_ptr + rn[:, None] * ng + g_hi[None, :], mask=gm, other=0.0)
            z_hi = tl.load(z_ptr + rn[:, None] * ng + g_hi[None, :], mask=gm, other=0.0)
            acc += (s_lo.to(tl.float32) * qx_lo + z_lo.to(tl.float32) * xs_lo[None, :]
                    + s_hi.to(tl.float32) * qx_hi + z_hi.to(tl.float32) * xs_hi[None, :])
        y = tl.sum(acc, axis=1)
        tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=rn < N)

    @triton.autotune(configs=_GEMM4, key=["N", "K", "G", "M_BUCKET"])
    @triton.jit
    def _int4_gemm(x_ptr, p_ptr, s_ptr, z_ptr, y_ptr, M, N, K, M_BUCKET,
                   G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   GROUPS: tl.constexpr):
        BLOCK_K: tl.constexpr = GROUPS * G
        half = K // 2
        ng = K // G
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        rg = tl.arange(0, GROUPS)
        mmask, nmask = rm[:, None] < M, rn[None, :] < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for j0 in range(0, half, BLOCK_K):
            j = j0 + rk
            jm = j[:, None] < half
            b = tl.load(p_ptr + rn[None, :] * half + j[:, None], mask=nmask & jm,
                        other=0)  # [BK, BN]
            x_lo = tl.load(x_ptr + rm[:, None] * K + j[None, :],
                           mask=mmask & (j[None, :] < half), other=0.0)
            x_hi = tl.load(x_ptr + rm[:, None] * K + half + j[None, :],
                           mask=mmask & (j[None, :] < half), other=0.0)
            g_lo = j0 // G + rg
            g_hi = (j0 + half) // G + rg
            gm = nmask & (g_lo[:, None] < half // G)  # [GROUPS, BN]
            s_lo = tl.load(s_ptr + rn[None, :] * ng + g_lo[:, None], mask=gm, other=0.0)
            z_lo = tl.load(z_ptr + rn[None, :] * ng + g_lo[:, None], mask=gm, other=0.0)
            s_hi = tl.load(s_ptr + rn[None, :] * ng + g_hi[:, None], mask=gm, other=0.0)
            z_hi = tl.load(z_ptr + rn[None, :] * ng + g_hi[:, None], mask=gm, other=0.0)
            q_lo = tl.reshape((b & 15).to(s_lo.dtype), (GROUPS, G, BLOCK_N))
            q_hi = tl.reshape((b >> 4).to(s_hi.dtype), (GROUPS, G, BLOCK_N))
            w_lo = tl.reshape(q_lo * s_lo[:, None, :] + z_lo[:, None, :], (BLOCK_K, BLOCK_N))
            w_hi = tl.reshape(q_hi * s_hi[:, None, :] + z_hi[:, None, :], (BLOCK_K, BLOCK_N))
            acc = tl.dot(x_lo, w_lo.to(x_lo.dtype), acc)
            acc = tl.dot(x_hi, w_hi.to(x_hi.dtype), acc)
        tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=mmask & nmask)


def _block_m(M: int) -> int:
    """BLOCK_M covers the batch (tl.dot needs >= 16); the autotuner keys on it too."""
    return 16 if M <= 16 else 32 if M <= 32 else 64


def _launch(gemv, gemm, x: torch.Tensor, N: int, weights: tuple, **consts) -> torch.Tensor:
    """y [M, N] = x [M, K] @ W.T: the GEMV for one row, else the GEMM over BLOCK_M rows."""
    M, K = x.shape
    x = x.contiguous()
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    if M == 1:
        grid = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
        gemv[grid](x, *weights, y, N, K, **consts)
    else:
        bm = _block_m(M)
        grid = lambda meta: (triton.cdiv(M, bm), triton.cdiv(N, meta["BLOCK_N"]))  # noqa: E731
        gemm[grid](x, *weights, y, M, N, K, bm, BLOCK_M=bm, **consts)
    return y


def int8_matmul(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ (q [N, K] int8 * scale [N]).T -> [M, N] in x's dtype."""
    return _launch(_int8_gemv, _int8_gemm, x, q.shape[0], (q, scale))


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, lo: torch.Tensor,
                group_size: int) -> torch.Tensor:
    """x [M, K] @ W.T with W unpacked from (packed [N, K/2], scale/min [N, K/G]) -> [M, N]."""
    return _launch(_int4_gemv, _int4_gemm, x, packed.shape[0], (packed, scale, lo),
                   G=group_size)
