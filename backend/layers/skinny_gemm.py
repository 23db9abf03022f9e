"""Few-token matmuls (CUDA, Triton tensor cores): the linear layers of a decode step of
2..MAX_M sequences, where cuBLAS leaves bandwidth unused.

At a few dozen tokens a linear layer is still bound by its weight bytes (Llama-2-7B at 64
tokens does ~64 multiply-adds per weight, far below the H200's ratio), so the kernel
streams [BLOCK_N, BLOCK_K] weight tiles once, pipelined, and multiplies each with all the
step's rows ([BLOCK_M, BLOCK_K], from L2). Layers with few output rows (o, down: 4096)
split K so every multiprocessor has work; the fp32 partial sums are added by one more small
kernel (``finish_splits``). The kernels launch with programmatic dependent launch
(``pdl``), so the norm / SiLU·mul kernel before each matmul overlaps its tail. The same
kernel reads int8 codes (``quant_kernels.int8_matmul`` where ``INT8_CONFIGS`` has a tile),
widening each tile in registers and scaling the sums per output row.

Tiles come from ``benchmarks.skinny_gemm`` per (BLOCK_M, N, K): a shape runs here only where
the measured tile beat cuBLAS (the step ops' prologue kernel before both), else cuBLAS.
Computing the prologue inside every program (as the one-token GEMV does) was measured too:
with the separate kernel overlapped it was no faster at 16 rows and lost from 32 on (every
program redoes [BLOCK_M, K] of elementwise work per BLOCK_N weight rows).
"""
from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None
try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # Triton before host-side tensor descriptors: the pointer loads only
    TensorDescriptor = None

from backend.layers import pdl
from backend.layers.gpu import multiprocessors
from backend.layers.launch import fast
from backend.layers.splits import finish_splits, split_out

if triton is not None:
    from backend.layers.pdl import release as pdl_release
    from backend.layers.pdl import wait as pdl_wait

AVAILABLE = triton is not None and (torch.cuda.is_available()
                                    or os.environ.get("TRITON_INTERPRET") == "1")
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
MAX_M = 128

# Tile shapes per (BLOCK_M, N, K) from ``benchmarks.skinny_gemm`` on an H200, Llama-2-7B's
# shapes, weights rotated past L2, the prologue kernel before each (docs/benchmarks/gemv/,
# docs/BENCHMARKS.md). Only tiles that beat cuBLAS are listed: at 16 and 32 rows every
# shape (by 1.6-4 us), at 64 all but qkv, at 128 o, down and the LM head. TMA tiles
# (tensor descriptors) won o, gate_up, down and the LM head at 64 rows and o and down at
# 128; the others were kept where the new run's best was within 1 % of them.
# DEFAULT: other shapes at 16 and 32 rows; larger buckets run cuBLAS.
_T = dict(BLOCK_N=128, BLOCK_K=128, STAGES=4, SPLIT=1, SWAP=1, num_warps=4)
_NARROW_TMA = dict(_T, BLOCK_N=32, BLOCK_K=256, SWAP=0, TMA=1)  # 4096-row outputs, 64 rows
CONFIGS: dict[tuple[int, int, int], dict] = {
    (16, 12288, 4096): _T,
    (16, 4096, 4096): dict(_T, BLOCK_N=64, BLOCK_K=256, STAGES=3, SPLIT=2),
    (16, 22016, 4096): dict(_T, BLOCK_K=64),
    (16, 4096, 11008): dict(_T, SPLIT=4),
    (16, 32000, 4096): dict(_T, STAGES=3, num_warps=8),
    (32, 12288, 4096): _T,
    (32, 4096, 4096): dict(_T, BLOCK_N=64, SPLIT=2),
    (32, 22016, 4096): dict(_T, BLOCK_N=256, STAGES=3, SWAP=0, num_warps=8),
    (32, 4096, 11008): dict(_T, BLOCK_N=64, BLOCK_K=256, STAGES=3, SPLIT=2),
    (32, 32000, 4096): _T,
    (64, 4096, 4096): _NARROW_TMA,
    (64, 22016, 4096): dict(_T, BLOCK_K=64, TMA=1),
    (64, 4096, 11008): _NARROW_TMA,
    (64, 32000, 4096): dict(_T, SWAP=0, TMA=1),
    (128, 4096, 4096): dict(_T, BLOCK_N=64, SPLIT=2, TMA=1),
    (128, 4096, 11008): dict(_T, BLOCK_N=64, SPLIT=2, TMA=1),
    (128, 32000, 4096): dict(_T, BLOCK_K=64, STAGES=5, SWAP=0, num_warps=8),
}
DEFAULT = {16: dict(_T, BLOCK_N=64, SPLIT=0), 32: dict(_T, BLOCK_N=64, SPLIT=0)}
# int8 codes (``quant_kernels.int8_matmul``), per (BLOCK_M, N, K): the fastest tiles of
# ``benchmarks.skinny_gemm --weights int8`` on an H200 (Llama-2-7B, weights rotated past
# L2, prologue kernel before each), every one ahead of the int8 GEMM: at 64 rows qkv 26.7
# vs 29.9 us, o 12.4 vs 15.5, gate_up 42.3 vs 48.2, down 28.0 vs 36.2, LM head 56.8 vs
# 82.9; at 16 / 32 rows a Llama block 77.9 / 95.5 vs 101.5 / 149.6. Other shapes and token
# counts run the int8 GEMM.
INT8_CONFIGS: dict[tuple[int, int, int], dict] = {
    (16, 12288, 4096): dict(_T, STAGES=3, SPLIT=4, SWAP=0, num_warps=8),
    (16, 4096, 4096): dict(_T, BLOCK_N=32, BLOCK_K=256, STAGES=3, SPLIT=2, SWAP=0),
    (16, 22016, 4096): dict(_T, BLOCK_N=64, SWAP=0),
    (16, 4096, 11008): dict(_NARROW_TMA, SPLIT=4),
    (16, 32000, 4096): dict(_T, BLOCK_N=256, STAGES=3, SPLIT=2, SWAP=0, num_warps=8),
    (32, 12288, 4096): dict(_T, SPLIT=4, SWAP=0, TMA=1),
    (32, 4096, 4096): dict(_NARROW_TMA, SPLIT=2),
    (32, 22016, 4096): dict(_T, SPLIT=2, SWAP=0, TMA=1),
    (32, 4096, 11008): dict(_T, BLOCK_N=64, BLOCK_K=256, STAGES=3, SPLIT=4),
    (32, 32000, 4096): dict(_T, BLOCK_N=64, SWAP=0),
    (64, 12288, 4096): dict(_T, BLOCK_K=64, SPLIT=4, SWAP=0, TMA=1),
    (64, 4096, 4096): dict(_T, BLOCK_N=64, SPLIT=4, TMA=1),
    (64, 22016, 4096): dict(_T, BLOCK_K=64, SPLIT=2, SWAP=0, TMA=1),
    (64, 4096, 11008): dict(_T, BLOCK_N=64, BLOCK_K=64, STAGES=6, SPLIT=4, SWAP=0, TMA=1),
    (64, 32000, 4096): dict(_T, TMA=1),
}


def bucket(M: int) -> int:
    """The kernel's BLOCK_M for M rows (tl.dot needs >= 16)."""
    return 16 if M <= 16 else 32 if M <= 32 else 64 if M <= 64 else 128


def config_for(M: int, N: int, K: int) -> dict | None:
    """The tile for M rows of an [N, K] weight, or None where cuBLAS runs."""
    bm = bucket(M)
    return CONFIGS.get((bm, N, K), DEFAULT.get(bm))


def int8_config_for(M: int, N: int, K: int) -> dict | None:
    """The tile for M rows of [N, K] int8 codes, or None where the int8 GEMM runs."""
    return INT8_CONFIGS.get((bucket(M), N, K)) if 2 <= M <= MAX_M else None


if triton is not None:
    @fast
    @triton.jit
    def _skinny_gemm(x_ptr, w_ptr, b_ptr, s_ptr, y_ptr, M, N, K, K_SPLIT,
                     HAS_BIAS: tl.constexpr, SCALED: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, STAGES: tl.constexpr, EVEN: tl.constexpr,
                     PARTIAL: tl.constexpr, SWAP: tl.constexpr, TMA: tl.constexpr,
                     F32_DOT: tl.constexpr, PDL: tl.constexpr):
        # y[m, n] = sum_k x[m, k] W[n, k] (+ b[n]) over this program's K range
        # [pid_k K_SPLIT, +K_SPLIT). SWAP: y.T = W x.T, the weight tile the left operand (a
        # warpgroup MMA needs >= 64 rows on the left, which the weight has at any M).
        # PARTIAL: fp32 sums into [splits, M, N]. TMA: x_ptr and w_ptr are tensor
        # descriptors of [BLOCK_M, BLOCK_K] and [BLOCK_N, BLOCK_K] boxes: the tiles come by
        # the copy engine (Hopper's TMA; zero-filled past the edges, no address arithmetic
        # or masks per element). F32_DOT: multiply in fp32 (the interpreter's tl.dot reads
        # bf16 operands as raw integers). SCALED: W = q * scale[n] with q int8 codes,
        # widened to x's dtype in registers (exact) and the scale applied to the sums.
        pdl_wait(PDL)
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rm = tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        rows = rm[:, None] < M
        k_lo = pid_k * K_SPLIT
        k_hi = tl.minimum(K, k_lo + K_SPLIT)
        if SWAP:
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=STAGES):
            k = (k0 + rk)[None, :]  # [1, BK]
            if TMA:  # split ranges are whole tiles; the last tile's columns past K read 0
                w = w_ptr.load([pid_n * BLOCK_N, k0])  # [BN, BK]
                a = x_ptr.load([0, k0])  # [BM, BK]
            else:
                if EVEN:
                    w = tl.load(w_ptr + rn[:, None] * K + k)  # [BN, BK]
                else:
                    w = tl.load(w_ptr + rn[:, None] * K + k,
                                mask=(rn[:, None] < N) & (k < k_hi), other=0.0)
                a = tl.load(x_ptr + rm[:, None] * K + k, mask=rows & (k < k_hi), other=0.0)
            if F32_DOT:
                a, w = a.to(tl.float32), w.to(tl.float32)
            elif SCALED:
                w = w.to(a.dtype)
            if SWAP:
                acc = tl.dot(w, tl.trans(a), acc)
            else:
                acc = tl.dot(a, tl.trans(w), acc)
        pdl_release(PDL)
        if SWAP:
            acc = tl.trans(acc)  # [BM, BN]
        if SCALED:
            acc *= tl.load(s_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        if HAS_BIAS:
            b = tl.load(b_ptr + rn, mask=rn < N, other=0.0) * (pid_k == 0).to(tl.float32)
            acc += b[None, :]
        mask = rows & (rn[None, :] < N)
        offs = rm[:, None] * N + rn[None, :]
        if PARTIAL:
            tl.store(y_ptr + pid_k * M * N + offs, acc, mask=mask)
        else:
            tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


def runs(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a step's matmul of x [M, K] with weight [N, K] takes ``skinny_gemm``: CUDA,
    2..MAX_M rows, a tile for the shape, a 16-bit float weight in x's dtype (fp32 would
    multiply in tf32). Not on the CPU: there the interpreter would run it, far slower than
    torch (``skinny_gemm`` itself runs there for tests)."""
    return (AVAILABLE and x.device.type == "cuda" and 2 <= x.shape[0] <= MAX_M
            and weight.dtype == x.dtype and x.dtype in (torch.bfloat16, torch.float16)
            and config_for(x.shape[0], *weight.shape) is not None)


def _auto_split(N: int, bn: int, steps: int, device: torch.device) -> int:
    """K splits (1, 2 or 4) that give every multiprocessor a program, >= 4 steps each."""
    sms = multiprocessors(device, 132)
    split = 1
    while triton.cdiv(N, bn) * split < sms and split < 4 and steps // (2 * split) >= 4:
        split *= 2
    return split


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                config: dict | None = None, scale: torch.Tensor | None = None
                ) -> torch.Tensor:
    """x [M, K] @ weight [N, K].T (+ bias) -> [M, N] for 2 <= M <= MAX_M (``config``: a
    tile to try; by default the shape's). With ``scale`` [N], weight holds int8 codes and
    W = weight * scale[:, None]."""
    (M, K), N = x.shape, weight.shape[0]
    assert weight.shape[1] == K and x.is_contiguous() and weight.is_contiguous()
    cfg = config or (int8_config_for(M, N, K) if scale is not None else config_for(M, N, K))
    if cfg is None:
        raise ValueError(f"no few-token tile for {M} rows of a [{N}, {K}] weight (see runs())")
    bn, bk = cfg["BLOCK_N"], min(cfg["BLOCK_K"], triton.next_power_of_2(K))
    steps = triton.cdiv(K, bk)
    split = cfg["SPLIT"] or _auto_split(N, bn, steps, x.device)
    per = triton.cdiv(steps, min(split, steps)) * bk
    split = triton.cdiv(K, per)
    y, out = split_out(x, M, N, split)
    opts = {} if INTERPRET else dict(num_warps=cfg["num_warps"])
    tma = bool(cfg.get("TMA")) and _tma_ok(x, weight)
    xa, wa = ((TensorDescriptor.from_tensor(x, [bucket(M), bk]),
               TensorDescriptor.from_tensor(weight, [bn, bk])) if tma else (x, weight))
    _skinny_gemm[(triton.cdiv(N, bn), split)](
        xa, wa, bias if bias is not None else weight, scale if scale is not None else weight,
        out, M, N, K, per, HAS_BIAS=bias is not None, SCALED=scale is not None,
        BLOCK_M=bucket(M), BLOCK_N=bn, BLOCK_K=bk,
        STAGES=cfg["STAGES"], EVEN=N % bn == 0 and K % per == 0, PARTIAL=split > 1,
        SWAP=cfg["SWAP"], TMA=tma, F32_DOT=INTERPRET, **opts, **pdl.launch(x.device))
    return finish_splits(y, out, split)


def _tma_ok(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the tiles can come by TMA: Triton with tensor descriptors, a Hopper or later
    GPU (or the interpreter), 16-byte aligned bases and row strides. Otherwise a TMA tile
    runs the same shape with pointer loads."""
    if TensorDescriptor is None:
        return False
    if not INTERPRET and torch.cuda.get_device_capability(x.device)[0] < 9:
        return False
    return all(t.data_ptr() % 16 == 0 and t.stride(0) * t.element_size() % 16 == 0
               for t in (x, weight))
