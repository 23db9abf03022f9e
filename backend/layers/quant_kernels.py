"""Triton kernels for weight-only int8 / int4 matmuls on CUDA (decode: one token to a few
dozen per step), plus the int4 packing they read and a torch dequantiser.

Layouts:
  * int8: q [N, K] int8, scale [N] (model dtype); y = (x @ q.T) * scale.
  * int4: packed [N, K / 2] uint8 with packed[n, j] = code[n, j] | code[n, j + K/2] << 4 (the
    two halves of a row share a byte, so one contiguous tile of bytes feeds two contiguous
    tiles of x); W = code * scale + min, scale / min per group of G columns (model dtype),
    kept as one tensor ``scale_min`` [N, K / (2G), 4]: for group j of the low half, its
    scale, its min, then the scale and min of group j of the high half (the group whose
    codes share its bytes). A kernel reads a tile's four with one load (``pack_scale_min``).

``int8_matmul`` / ``int4_matmul`` run a GEMV for one row of x (a reduction per output, fp32
accumulate) or, for several rows, a tl.dot GEMM that dequantises each weight tile in
registers; either may split K (fp32 partial sums, see ``splits``: the GEMVs add them up in
the kernel) so that skinny layers still occupy every multiprocessor. Both read each weight
byte once per call. Tile shapes and variants come from ``CONFIGS``, keyed by format and
token-count bucket. Every choice depends on shapes only, so the calls can be captured in
CUDA graphs.
Under ``TRITON_INTERPRET=1`` the kernels run on CPU tensors (the tests do that).

Decoding codes without an int -> float conversion (``MAGIC``; conversions issue at a
fraction of the integer/float rate): a code is written into the mantissa of a float, an
integer op. GEMVs, fp32: int8 q -> bits 0x3FC00000 + q * 2^15 = 1.5 + q / 256, summed as
x * f and recovered as 256 * (sum x f - 1.5 sum x); a nibble n -> 0x3F800000 | n << 19 =
1 + n / 16, so n s + m = f * 16 s + (m - 16 s). f stays within [1, 2), so the fp32 sums
lose nothing that matters against bf16 outputs. The int4 GEMM in bf16: 0x4300 | n = 128 + n.
The word-wise GEMVs (``WORDS``) read the codes as int32 words and decode a code with a
single AND: a field n at bits P..P+w-1 (P + w <= 24) is, read as fp32, exactly
n * 2^(P - 149), a subnormal or lowest-binade number; x is pre-scaled by 2^(100 - P) so
every product is n * x * 2^-49, all in the normal range (FFMA keeps subnormal inputs: Triton
compiles fp32 arithmetic without flush-to-zero). int8 codes become unsigned by an XOR of
0x80 per byte first. The int4 GEMM multiplies W x.T (``SWAP``): the dequantised tile is
tl.dot's left operand (on Hopper the left operand of a warpgroup MMA may sit in registers,
the right one must be in shared memory); measured 1.4-1.8x faster than x W.T on
Llama-2-7B's shapes at 64 tokens.
"""
from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the CPU packed ops need no Triton
    triton = None

from backend.layers import pdl, skinny_gemm
from backend.layers.gemv import Prologue
from backend.layers.gpu import multiprocessors
from backend.layers.launch import fast
from backend.layers.splits import COUNTERS, added_in_kernel, counters, finish_splits, split_out

if triton is not None:
    from backend.layers.gemv import norm_scale, prologue_values
    from backend.layers.pdl import release as pdl_release
    from backend.layers.pdl import wait as pdl_wait
    from backend.layers.splits import add_splits, gather_splits

AVAILABLE = triton is not None and (torch.cuda.is_available()
                                    or os.environ.get("TRITON_INTERPRET") == "1")
# The one-token int4 GEMV's epilogues (``_int4_gemv_words``' EPI): an RMSNorm split between
# the GEMV that makes its input (ADDED: the residual add and the sums of squares) and the
# GEMV that consumes it (NORMED: the weight on x, the scale on the sums), so the add + RMSNorm
# kernel between them does not run. Off unless ``FIRSTTOKEN_SPLIT_NORM=1``: not yet timed on
# a GPU (docs/BENCHMARKS.md "The RMSNorm split between int4 one-token GEMVs").
PLAIN, NORMED, ADDED = 0, 1, 2
SPLIT_NORM = os.environ.get("FIRSTTOKEN_SPLIT_NORM", "0") == "1"
# The one-token int4 GEMV's first weight loads issued before the wait for the previous
# kernel, its loop pipelined in registers (``_int4_words_piece_early``). Off unless
# ``FIRSTTOKEN_INT4_EARLY=1``: not yet timed on a GPU.
EARLY_WEIGHTS = os.environ.get("FIRSTTOKEN_INT4_EARLY", "0") == "1"


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """codes [N, K] (0..15) -> [N, K / 2] uint8, low nibble = column j, high = j + K/2."""
    half = codes.shape[1] // 2
    c = codes.to(torch.uint8)
    return (c[:, :half] | (c[:, half:] << 4)).contiguous()


def pack_scale_min(scale: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """scale / min [N, K / G] -> ``scale_min`` [N, K / (2G), 4] (see the layouts above).
    The groups must not straddle the row halves (an even number of them)."""
    if scale.shape[1] % 2:
        raise ValueError(f"{scale.shape[1]} groups a row: the int4 layout pairs the groups "
                         "of the two row halves, so it needs an even number")
    hg = scale.shape[1] // 2
    return torch.stack((scale[:, :hg], lo[:, :hg], scale[:, hg:], lo[:, hg:]),
                       dim=-1).contiguous()


def unpack_scale_min(scale_min: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``scale_min`` [N, K / (2G), 4] -> (scale, min), each [N, K / G]."""
    return (torch.cat((scale_min[..., 0], scale_min[..., 2]), dim=1),
            torch.cat((scale_min[..., 1], scale_min[..., 3]), dim=1))


def dequantize_int4(packed: torch.Tensor, scale_min: torch.Tensor,
                    group_size: int) -> torch.Tensor:
    """[N, K] in scale_min's dtype from the packed layout (large-batch path and tests)."""
    scale, lo = unpack_scale_min(scale_min)
    codes = torch.cat((packed & 15, packed >> 4), dim=1)  # [N, K] uint8
    N, K = codes.shape
    g = codes.view(N, K // group_size, group_size).to(scale.dtype)
    return (g * scale.unsqueeze(-1) + lo.unsqueeze(-1)).view(N, K)


def int4_supported(in_features: int, group_size: int) -> bool:
    """The kernels tile a group as one power-of-two block of >= 16 bytes of each row half."""
    return (group_size >= 16 and group_size & (group_size - 1) == 0
            and (in_features // 2) % group_size == 0)


# Kernel parameters per format and token-count bucket (1 = one token; 16/32/64/128 = the
# GEMM's BLOCK_M), the fastest in ``benchmarks.quant_sweep`` on an H200 summed over
# Llama-2-7B's four linear shapes (docs/benchmarks/quant.md, third sweep). A config with
# MAGIC (int8) or BYTES (int4) runs a GEMV (WORDS: the word-wise one, see
# ``_int8_gemv_words``), one with SPLIT_K the GEMM (16 rows, one used, at one token).
# SPLIT_K 0 = choose from the grid size (``_split_k``, aiming at SPLIT_TARGET programs per
# multiprocessor). "int4-g<G>" entries override "int4" for that group size.
_INT8_GEMM = dict(BLOCK_N=64, BLOCK_K=64, SPLIT_K=0, SPLIT_TARGET=2, num_warps=4, num_stages=5)
_INT4_GEMM = dict(BLOCK_N=64, GROUPS=1, SPLIT_K=0, MAGIC=3, SWAP=1, SPLIT_TARGET=2,
                  num_warps=4, num_stages=3)
CONFIGS: dict[str, dict[int, dict]] = {
    "int8": {1: dict(BLOCK_N=8, BLOCK_K=1024, MAGIC=1, WORDS=1, num_warps=4, num_stages=3),
             **{m: _INT8_GEMM for m in (16, 32, 64, 128)}},
    "int4": {1: dict(BLOCK_N=16, BYTES=512, MAGIC=1, WORDS=1, num_warps=4, num_stages=3),
             **{m: _INT4_GEMM for m in (16, 32, 64, 128)}},
    # g32 at one token: the per-weight GEMV (87.9 us per block; word-wise 94.8)
    "int4-g32": {1: dict(BLOCK_N=2, BYTES=1024, MAGIC=1, num_warps=4, num_stages=3),
                 **{m: dict(_INT4_GEMM, BLOCK_N=128, num_warps=8) for m in (16, 32, 64, 128)}},
    # g128 at one token: word-wise, 64 rows a program on two warps (8 rows a thread share
    # each x value), four programs per multiprocessor, K split for the 4096-row layers,
    # three pipeline stages (every load of its loop 8 or 16 bytes: see _int4_gemv_words).
    # With codes and scales rotated past L2: 48.2 us per block; 52.3 unpipelined, 58.2
    # with 2-byte x loads (docs/benchmarks/quant/int4-gemv-records/).
    "int4-g128": {1: dict(BLOCK_N=64, BYTES=128, MAGIC=1, WORDS=1, STAGES=3, PROGRAMS_PER_SM=4,
                          SPLIT_GEMV=1, num_warps=2, num_stages=3),
                  # 16 / 32 tokens: K split until two programs per multiprocessor (the
                  # engine's step at batch 32: 5.71 against 5.88 ms aiming at one)
                  16: _INT4_GEMM, 32: _INT4_GEMM,
                  # 64 tokens: stream-K on two programs per multiprocessor where the tiles
                  # fill the GPU (``_int4_gemm_stream``); at 16 and 32 tokens it lost
                  64: dict(_INT4_GEMM, SPLIT_TARGET=1, STREAM_K=2),
                  128: dict(_INT4_GEMM, SPLIT_TARGET=1)},
}
# The int8 one-token GEMV with its prologue fused (``int8_gemv_fused``), per (N, K): only
# where ``benchmarks.one_token_gemv`` measured it faster than the separate prologue kernel
# then the GEMV (H200, Llama-2-7B, weights rotated past L2, x read as [words, 4] (XVEC):
# qkv 17.2 vs 19.4 us, gate_up 27.8 vs 29.6; down lost, 18.5 vs 17.7: every program redoes
# SiLU for its rows). Other shapes run the steps apart; a layer without a prologue (o)
# runs ``int8_matmul``'s one-token GEMV, the same kernel.
INT8_FUSED: dict[tuple[int, int], dict] = {
    (12288, 4096): dict(BLOCK_N=16, BLOCK_K=512, MAGIC=1, WORDS=1, XVEC=1, num_warps=4,
                        num_stages=3),
    (22016, 4096): dict(BLOCK_N=32, BLOCK_K=256, MAGIC=1, WORDS=1, XVEC=1, num_warps=4,
                        num_stages=4),
}
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

if triton is not None:
    @fast
    @triton.jit
    def _int8_gemv(x_ptr, w_ptr, s_ptr, y_ptr, N, K, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, MAGIC: tl.constexpr, EVEN: tl.constexpr,
                   PDL: tl.constexpr):
        # y[n] = scale[n] * sum_k x[k] * q[n, k]; one program per BLOCK_N outputs, each
        # thread streaming 16-byte pieces of rows; one fp32 partial per (row, column) slot.
        pdl_wait(PDL)
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)[None, :]  # [1, BK]
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        xs = tl.zeros((1, BLOCK_K), dtype=tl.float32)
        w_ptrs = w_ptr + rn[:, None] * K + rk
        for k0 in range(0, K, BLOCK_K):
            k = k0 + rk
            if EVEN:
                x = tl.load(x_ptr + k).to(tl.float32)
                w = tl.load(w_ptrs + k0)
            else:
                x = tl.load(x_ptr + k, mask=k < K, other=0.0).to(tl.float32)
                w = tl.load(w_ptrs + k0, mask=(rn[:, None] < N) & (k < K), other=0)
            if MAGIC:
                f = (w.to(tl.int32) * 32768 + 0x3FC00000).to(tl.float32, bitcast=True)
                xs += x
            else:
                f = w.to(tl.float32)
            acc += f * x
        pdl_release(PDL)
        t = tl.sum(acc, axis=1)  # [BN]
        if MAGIC:
            t = 256.0 * (t - 1.5 * tl.sum(tl.sum(xs, axis=1), axis=0))
        s = tl.load(s_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
        tl.store(y_ptr + rn, (t * s).to(y_ptr.dtype.element_ty), mask=rn < N)

    @fast
    @triton.jit
    def _int4_gemv(x_ptr, p_ptr, sm_ptr, y_ptr, N, K, G: tl.constexpr,
                   BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, MAGIC: tl.constexpr,
                   EVEN: tl.constexpr, PDL: tl.constexpr):
        # Byte j of a row holds columns j (low nibble) and j + K/2 (high nibble). A tile is
        # [BLOCK_N rows, GROUPS groups, G bytes]; every weight is dequantised in fp32 and
        # multiplied into a [BN, GROUPS, G] accumulator, reduced once at the end (per-group
        # sums inside the loop cost more in shuffles than they save). MAGIC: f = 1 + n / 16,
        # so n s + m = f * 16 s + (m - 16 s), one FMA.
        pdl_wait(PDL)
        half = K // 2
        hg = half // G
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_N, GROUPS, G), dtype=tl.float32)
        for j0 in range(0, half, GROUPS * G):
            g = j0 // G + tl.arange(0, GROUPS)  # [GROUPS]
            j = (g[:, None] * G + tl.arange(0, G)[None, :])[None, :, :]  # [1, GROUPS, G]
            sp = sm_ptr + (rn[:, None] * hg + g[None, :]) * 4  # [BN, GROUPS]
            if EVEN:
                b = tl.load(p_ptr + rn[:, None, None] * half + j)
                x_lo = tl.load(x_ptr + j)
                x_hi = tl.load(x_ptr + half + j)
                s_lo = tl.load(sp)
                z_lo = tl.load(sp + 1)
                s_hi = tl.load(sp + 2)
                z_hi = tl.load(sp + 3)
            else:
                gm = g < hg
                sm = (rn[:, None] < N) & gm[None, :]
                b = tl.load(p_ptr + rn[:, None, None] * half + j, mask=sm[:, :, None], other=0)
                x_lo = tl.load(x_ptr + j, mask=gm[None, :, None], other=0.0)
                x_hi = tl.load(x_ptr + half + j, mask=gm[None, :, None], other=0.0)
                s_lo = tl.load(sp, mask=sm, other=0.0)
                z_lo = tl.load(sp + 1, mask=sm, other=0.0)
                s_hi = tl.load(sp + 2, mask=sm, other=0.0)
                z_hi = tl.load(sp + 3, mask=sm, other=0.0)
            s_lo, z_lo = s_lo.to(tl.float32), z_lo.to(tl.float32)
            s_hi, z_hi = s_hi.to(tl.float32), z_hi.to(tl.float32)
            bi = b.to(tl.int32)  # [BN, GROUPS, G]
            if MAGIC:
                f_lo = (((bi << 19) & 0x780000) | 0x3F800000).to(tl.float32, bitcast=True)
                f_hi = (((bi << 15) & 0x780000) | 0x3F800000).to(tl.float32, bitcast=True)
                s_lo, s_hi = 16.0 * s_lo, 16.0 * s_hi
                z_lo, z_hi = z_lo - s_lo, z_hi - s_hi
            else:
                f_lo = (bi & 15).to(tl.float32)
                f_hi = (bi >> 4).to(tl.float32)
            w_lo = f_lo * s_lo[:, :, None] + z_lo[:, :, None]
            w_hi = f_hi * s_hi[:, :, None] + z_hi[:, :, None]
            acc += w_lo * x_lo.to(tl.float32) + w_hi * x_hi.to(tl.float32)
        pdl_release(PDL)
        y = tl.sum(tl.sum(acc, axis=2), axis=1)
        tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=rn < N)

    @triton.jit
    def _subnormal(w, MASK: tl.constexpr):
        """The bits of int32 words w under MASK as fp32: a field n at bits P..P+w-1 (P + w <=
        24) reads as exactly n * 2^(P - 149) (subnormal or lowest binade): one AND decodes it."""
        return (w & MASK).to(tl.float32, bitcast=True)

    @fast
    @triton.jit
    def _int8_gemv_words(x_ptr, w_ptr, s_ptr, y_ptr, part_ptr, cnt_ptr, N, kw, W_SPLIT, r_ptr,
                         nw_ptr, ro_ptr, eps, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr,
                         EVEN: tl.constexpr, STAGES: tl.constexpr, PARTIAL: tl.constexpr,
                         PRO: tl.constexpr, XVEC: tl.constexpr, PDL: tl.constexpr):
        # q read as int32 words [N, K / 4] (word i: columns 4i..4i+3). XOR 0x80 per byte
        # gives u = q + 128 in 0..255; byte b decodes with one AND (``_subnormal``, the top
        # byte after a shift by 8) and its x is pre-scaled by 2^(100 - P), so each product
        # is u * x * 2^-49; y = scale * (2^49 * sum u x - 128 * sum x). kw = K / 4; program
        # (i, k) covers words [k W_SPLIT, (k + 1) W_SPLIT) (PARTIAL: ``add_splits``).
        # PRO: the activation's prologue (``gemv.prologue_values``; a norm needs one split).
        pdl_wait(PDL)
        pid_k = tl.program_id(1)
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        ri = tl.arange(0, BLOCK_W)
        acc = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.float32)
        xs = tl.zeros((BLOCK_W,), dtype=tl.float32)
        ss = tl.zeros((BLOCK_W,), dtype=tl.float32)
        store_end = (tl.program_id(0) == 0).to(tl.int32) * 4 * kw
        for i0 in tl.range(pid_k * W_SPLIT, tl.minimum(kw, (pid_k + 1) * W_SPLIT), BLOCK_W,
                           num_stages=STAGES):
            wi = i0 + ri  # [BW] word index
            if EVEN:
                w = tl.load(w_ptr + rn[:, None] * kw + wi[None, :])
            else:
                w = tl.load(w_ptr + rn[:, None] * kw + wi[None, :],
                            mask=(rn[:, None] < N) & (wi[None, :] < kw), other=0)
            u = w ^ -0x7F7F7F80  # 0x80808080 as int32
            u8 = u >> 8
            if XVEC:
                # x as [BW, 4] (each word's four columns side by side: vector loads, and the
                # scaling and sums once per value), then one [BW] plane per byte
                r4 = tl.arange(0, 4)[None, :]
                kk = 4 * wi[:, None] + r4  # [BW, 4]
                if PRO != 0:
                    xq, sx = prologue_values(x_ptr, r_ptr, nw_ptr, ro_ptr, kk, kk, kk < 4 * kw,
                                             4 * kw, store_end, PRO)
                    ss += tl.sum(sx * sx, axis=1)
                elif EVEN:
                    xq = tl.load(x_ptr + kk).to(tl.float32)
                else:
                    xq = tl.load(x_ptr + kk, mask=kk < 4 * kw, other=0.0).to(tl.float32)
                xs += tl.sum(xq, axis=1)
                xq = xq * tl.where(r4 == 0, 2.0 ** 100, tl.where(r4 == 1, 2.0 ** 92, 2.0 ** 84))
                xa, xb = tl.split(tl.reshape(xq, (BLOCK_W, 2, 2)))  # columns 0|2, 1|3
                x0, x2 = tl.split(xa)
                x1, x3 = tl.split(xb)
                acc += _subnormal(u, 0xFF) * x0[None, :]
                acc += _subnormal(u, 0xFF00) * x1[None, :]
                acc += _subnormal(u, 0xFF0000) * x2[None, :]
                acc += _subnormal(u8, 0xFF0000) * x3[None, :]
            for b in tl.static_range(4 * (1 - XVEC)):
                if PRO != 0:
                    k = 4 * wi + b
                    x, sx = prologue_values(x_ptr, r_ptr, nw_ptr, ro_ptr, k, k, wi < kw,
                                            4 * kw, store_end, PRO)
                    ss += sx * sx
                elif EVEN:
                    x = tl.load(x_ptr + 4 * wi + b).to(tl.float32)
                else:
                    x = tl.load(x_ptr + 4 * wi + b, mask=wi < kw, other=0.0).to(tl.float32)
                xs += x
                if b < 3:
                    f = _subnormal(u, 0xFF << (8 * b))
                    x = x * (2.0 ** (100 - 8 * b))
                else:
                    f = _subnormal(u8, 0xFF0000)
                    x = x * (2.0 ** 84)
                acc += f * x[None, :]
        pdl_release(PDL)
        t = tl.sum(acc, axis=1) * (2.0 ** 49) - 128.0 * tl.sum(xs, axis=0)  # [BN]
        s = tl.load(s_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
        s = s * norm_scale(tl.sum(ss, axis=0), 4 * kw, eps, PRO)
        _store_row(y_ptr, part_ptr, cnt_ptr, t * s, rn, pid_k, N, PARTIAL)

    @triton.jit
    def _bf16_of_words(a0, a1, B: tl.constexpr):
        """Element B of four bf16 held in int32 words a0 (elements 0, 1) and a1 (2, 3), as
        fp32: bf16 is the top half of an fp32, so a shift or an AND."""
        a = a0 if B < 2 else a1
        if B % 2 == 0:
            return (a << 16).to(tl.float32, bitcast=True)
        return (a & -65536).to(tl.float32, bitcast=True)

    @triton.jit
    def _int4_words_cols(K, j0, G: tl.constexpr, GROUPS: tl.constexpr, end=None):
        """Step j0's groups [GROUPS] (of a row half), word index [GROUPS, G / 4], and which
        groups are inside the half (and before word ``end``)."""
        GW: tl.constexpr = G // 4
        g = j0 // GW + tl.arange(0, GROUPS)  # [GROUPS]
        wi = g[:, None] * GW + tl.arange(0, GW)[None, :]  # [GROUPS, GW] word index
        gm = g < K // 2 // G
        if end is not None:
            gm = gm & (g * GW < end)
        return g, wi, gm

    @triton.jit
    def _int4_words_weights(p_ptr, sm_ptr, rn, N, K, hw, j0, G: tl.constexpr,
                            GROUPS: tl.constexpr, EVEN: tl.constexpr, BF16: tl.constexpr,
                            end=None):
        """Step j0's codes [BN, GROUPS, G / 4] (int32 words) and, BF16, scale records [BN,
        GROUPS] (int64; else the codes again, unused): the loads that depend on no earlier
        kernel. ``end``: zeros for the groups from word ``end`` of a row half on (not
        loaded)."""
        g, wi, gm = _int4_words_cols(K, j0, G, GROUPS, end)
        ri = rn[:, None] * (K // 2 // G) + g[None, :]  # [BN, GROUPS] record index
        sm = (rn[:, None] < N) & gm[None, :]
        wp = p_ptr + rn[:, None, None] * hw + wi[None, :, :]
        rp = sm_ptr.to(tl.pointer_type(tl.int64)) + ri
        if EVEN and end is None:
            w = tl.load(wp)
            r = tl.load(rp) if BF16 else w
        else:
            w = tl.load(wp, mask=sm[:, :, None], other=0)
            r = tl.load(rp, mask=sm, other=0) if BF16 else w
        return w, r

    @triton.jit
    def _int4_words_x(x_ptr, K, hw, j0, G: tl.constexpr, GROUPS: tl.constexpr,
                      EVEN: tl.constexpr, end=None):
        """Step j0's x as int64 words of four bf16 values [GROUPS, G / 4], of the low half
        (x[4i .. 4i + 3]) and of the high half (x[half + 4i ..]). ``end``: as
        ``_int4_words_weights``."""
        g, wi, gm = _int4_words_cols(K, j0, G, GROUPS, end)
        xw = x_ptr.to(tl.pointer_type(tl.int64))
        if EVEN and end is None:
            return tl.load(xw + wi), tl.load(xw + hw + wi)
        return (tl.load(xw + wi, mask=gm[:, None], other=0),
                tl.load(xw + hw + wi, mask=gm[:, None], other=0))

    @triton.jit
    def _int4_words_step(acc, acc_z, x_ptr, p_ptr, sm_ptr, rn, N, K, hw, j0,
                         G: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr,
                         EVEN: tl.constexpr, BF16: tl.constexpr, xm_ptr=None,
                         XMUL: tl.constexpr = False, w=None, r=None, xw_lo=None, xw_hi=None,
                         mw_lo=None, mw_hi=None):
        """One step of ``_int4_words_piece``: words [j0, j0 + GROUPS G / 4) of rows ``rn``
        into the sums (acc [BLOCK_N, GROUPS, G / 4], acc_z [BLOCK_N, GROUPS]). XMUL: x
        times ``xm_ptr`` [K] (an RMSNorm's weight) column by column first. BF16 callers may
        pass the step's codes, records, x words and (XMUL) weight words already loaded
        (``w``, ``r``, ``xw_lo``, ``xw_hi``, ``mw_lo``, ``mw_hi``)."""
        half = K // 2
        GW: tl.constexpr = G // 4
        g, wi, gm = _int4_words_cols(K, j0, G, GROUPS)
        if w is None:
            w, r = _int4_words_weights(p_ptr, sm_ptr, rn, N, K, hw, j0, G, GROUPS, EVEN, BF16)
            if BF16:
                xw_lo, xw_hi = _int4_words_x(x_ptr, K, hw, j0, G, GROUPS, EVEN)
        if BF16:
            r0, r1 = r.to(tl.int32), (r >> 32).to(tl.int32)
            s_lo, z_lo = _bf16_of_words(r0, r1, 0), _bf16_of_words(r0, r1, 1)
            s_hi, z_hi = _bf16_of_words(r0, r1, 2), _bf16_of_words(r0, r1, 3)
            l0, l1 = xw_lo.to(tl.int32), (xw_lo >> 32).to(tl.int32)
            h0, h1 = xw_hi.to(tl.int32), (xw_hi >> 32).to(tl.int32)
            if XMUL:
                if mw_lo is None:
                    mw_lo, mw_hi = _int4_words_x(xm_ptr, K, hw, j0, G, GROUPS, EVEN)
                ml0, ml1 = mw_lo.to(tl.int32), (mw_lo >> 32).to(tl.int32)
                mh0, mh1 = mw_hi.to(tl.int32), (mw_hi >> 32).to(tl.int32)
        else:
            ri = rn[:, None] * (half // G) + g[None, :]
            sm = (rn[:, None] < N) & gm[None, :]
            sp = sm_ptr + ri * 4
            if EVEN:
                s_lo, z_lo = tl.load(sp).to(tl.float32), tl.load(sp + 1).to(tl.float32)
                s_hi, z_hi = tl.load(sp + 2).to(tl.float32), tl.load(sp + 3).to(tl.float32)
            else:
                s_lo = tl.load(sp, mask=sm, other=0.0).to(tl.float32)
                z_lo = tl.load(sp + 1, mask=sm, other=0.0).to(tl.float32)
                s_hi = tl.load(sp + 2, mask=sm, other=0.0).to(tl.float32)
                z_hi = tl.load(sp + 3, mask=sm, other=0.0).to(tl.float32)
        w8 = w >> 8  # byte 3's nibbles at bits 16..23
        xp = x_ptr + 4 * wi  # [GROUPS, GW]
        t_lo = tl.zeros((BLOCK_N, GROUPS, GW), dtype=tl.float32)
        t_hi = tl.zeros((BLOCK_N, GROUPS, GW), dtype=tl.float32)
        xs_lo = tl.zeros((GROUPS, GW), dtype=tl.float32)
        xs_hi = tl.zeros((GROUPS, GW), dtype=tl.float32)
        for b in tl.static_range(4):
            if BF16:
                xl = _bf16_of_words(l0, l1, b)
                xh = _bf16_of_words(h0, h1, b)
                if XMUL:
                    xl = xl * _bf16_of_words(ml0, ml1, b)
                    xh = xh * _bf16_of_words(mh0, mh1, b)
            else:
                if EVEN:
                    xl = tl.load(xp + b).to(tl.float32)
                    xh = tl.load(xp + half + b).to(tl.float32)
                else:
                    xl = tl.load(xp + b, mask=gm[:, None], other=0.0).to(tl.float32)
                    xh = tl.load(xp + half + b, mask=gm[:, None], other=0.0).to(tl.float32)
                if XMUL:
                    mp = xm_ptr + 4 * wi
                    xl = xl * tl.load(mp + b, mask=gm[:, None], other=0.0).to(tl.float32)
                    xh = xh * tl.load(mp + half + b, mask=gm[:, None], other=0.0).to(tl.float32)
            xs_lo += xl
            xs_hi += xh
            if b < 3:  # low nibble at P = 8b, high at 8b + 4
                f_lo = _subnormal(w, 0xF << (8 * b))
                f_hi = _subnormal(w, 0xF0 << (8 * b))
                xl = xl * (2.0 ** (100 - 8 * b))
                xh = xh * (2.0 ** (96 - 8 * b))
            else:  # from w >> 8: P = 16 and 20
                f_lo = _subnormal(w8, 0xF0000)
                f_hi = _subnormal(w8, 0xF00000)
                xl = xl * (2.0 ** 84)
                xh = xh * (2.0 ** 80)
            t_lo += f_lo * xl[None, :, :]
            t_hi += f_hi * xh[None, :, :]
        s_lo, s_hi = s_lo * (2.0 ** 49), s_hi * (2.0 ** 49)
        acc += t_lo * s_lo[:, :, None]  # two FMAs (a sum of both products is three)
        acc += t_hi * s_hi[:, :, None]
        # min * (sum of the group's x): once per row and group, the x sums shared
        acc_z += z_lo * tl.sum(xs_lo, axis=1)[None, :] + z_hi * tl.sum(xs_hi, axis=1)[None, :]
        return acc, acc_z

    @triton.jit
    def _int4_words_piece(x_ptr, p_ptr, sm_ptr, rn, N, K, hw, j_begin, j_end,
                          G: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr,
                          EVEN: tl.constexpr, STAGES: tl.constexpr, BF16: tl.constexpr,
                          xm_ptr=None, XMUL: tl.constexpr = False):
        """One token through rows ``rn`` of an int4 layer, words [j_begin, j_end) of each
        row half: the fp32 sums [BLOCK_N] (XMUL: of x times ``xm_ptr`` [K])."""
        # The packed codes read as int32 words [N, K / 8]: word i of a row holds bytes
        # 4i..4i+3, byte b columns 4i + b (bits 8b..8b+3) and half + 4i + b (8b+4..8b+7).
        # A nibble decodes with one AND (``_subnormal``: n * 2^(P - 149) for its bit
        # position P; the top byte's after one shift by 8), its x is pre-scaled by
        # 2^(100 - P) so every product is n * x * 2^-49. Per word and row: T = sum n x over
        # its four columns of each half, then acc += T * s * 2^49 + (sum x) * min.
        # Tile [BLOCK_N rows, GROUPS groups, G / 4 words]: x and its sums are shared by
        # the rows a thread holds. hw = K / 8 words per row, an argument so that Triton sees
        # its divisibility (16-byte loads).
        # BF16 (x and scales in bf16): every load of the loop is 8 or 16 bytes, so the
        # STAGES pipeline (cp.async) takes all of them: a row's four scales and mins as one
        # int64, x as int64 words of four values. 2-byte loads stay outside the pipeline,
        # and their latency was paid every step: 57.0 -> 48.2 us a Llama-2-7B block on an
        # H200 with this and three stages (docs/benchmarks/quant.md).
        GW: tl.constexpr = G // 4
        acc = tl.zeros((BLOCK_N, GROUPS, GW), dtype=tl.float32)
        acc_z = tl.zeros((BLOCK_N, GROUPS), dtype=tl.float32)
        for j0 in tl.range(j_begin, j_end, GROUPS * GW, num_stages=STAGES):
            acc, acc_z = _int4_words_step(acc, acc_z, x_ptr, p_ptr, sm_ptr, rn, N, K, hw, j0, G,
                                          BLOCK_N, GROUPS, EVEN, BF16, xm_ptr, XMUL)
        return tl.sum(tl.sum(acc, axis=2), axis=1) + tl.sum(acc_z, axis=1)

    @triton.jit
    def _int4_words_piece_early(x_ptr, p_ptr, sm_ptr, rn, N, K, hw, j_begin, j_end,
                                G: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr,
                                EVEN: tl.constexpr, PDL: tl.constexpr, xm_ptr=None,
                                XMUL: tl.constexpr = False):
        """``_int4_words_piece`` (BF16) with the first two steps' codes and records requested
        before the wait for the previous kernel (``pdl.wait``, which this does instead of
        the caller): weights depend on no kernel, so their first loads travel while the
        previous kernel finishes instead of after it. The loop is pipelined by hand in
        registers, two steps of codes and records and one of x ahead (not cp.async: its
        prologue would come after the wait); XMUL's weight words are read in each step
        (every program reads the same ones; carried ahead too they spilled registers). Same
        arithmetic and order, so the same sums."""
        S: tl.constexpr = GROUPS * (G // 4)
        GW: tl.constexpr = G // 4
        w0, r0 = _int4_words_weights(p_ptr, sm_ptr, rn, N, K, hw, j_begin, G, GROUPS, EVEN,
                                     True)
        w1, r1 = _int4_words_weights(p_ptr, sm_ptr, rn, N, K, hw, j_begin + S, G, GROUPS,
                                     EVEN, True, j_end)
        pdl_wait(PDL)
        xl0, xh0 = _int4_words_x(x_ptr, K, hw, j_begin, G, GROUPS, EVEN)
        acc = tl.zeros((BLOCK_N, GROUPS, GW), dtype=tl.float32)
        acc_z = tl.zeros((BLOCK_N, GROUPS), dtype=tl.float32)
        for j0 in tl.range(j_begin, j_end, S, num_stages=1):
            w2, r2 = _int4_words_weights(p_ptr, sm_ptr, rn, N, K, hw, j0 + 2 * S, G, GROUPS,
                                         EVEN, True, j_end)
            xl1, xh1 = _int4_words_x(x_ptr, K, hw, j0 + S, G, GROUPS, EVEN, j_end)
            acc, acc_z = _int4_words_step(acc, acc_z, x_ptr, p_ptr, sm_ptr, rn, N, K, hw, j0, G,
                                          BLOCK_N, GROUPS, EVEN, True, xm_ptr, XMUL, w0, r0,
                                          xl0, xh0)
            w0, r0, w1, r1, xl0, xh0 = w1, r1, w2, r2, xl1, xh1
        return tl.sum(tl.sum(acc, axis=2), axis=1) + tl.sum(acc_z, axis=1)

    @fast
    @triton.jit
    def _int4_gemv_words(x_ptr, p_ptr, sm_ptr, y_ptr, part_ptr, cnt_ptr, N, K, hw,
                         W_SPLIT, nw_ptr, ss_ptr, n_ss, res_ptr, eps, G: tl.constexpr,
                         BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, EVEN: tl.constexpr,
                         STAGES: tl.constexpr, BF16: tl.constexpr, PARTIAL: tl.constexpr,
                         PDL: tl.constexpr, EPI: tl.constexpr = 0, SS_N: tl.constexpr = 1,
                         EARLY: tl.constexpr = False):
        # Program (i, k) covers words [k W_SPLIT, (k + 1) W_SPLIT) of each row half of rows
        # block i (PARTIAL: ``add_splits``); the arithmetic is ``_int4_words_piece``'s.
        # EPI (``int4_gemv_normed`` / ``int4_gemv_added``): NORMED, x is a residual stream whose RMSNorm is
        # applied here, its weight (nw_ptr) to x and its scale, from the n_ss sums of
        # squares at ss_ptr, to the sums; ADDED, y + the residual at res_ptr is written
        # (``_store_added``) with its sums of squares by row block into ss_ptr.
        # EARLY (``_int4_words_piece_early``): the piece waits, after its first weight loads
        tl.static_assert(not EARLY or BF16, "EARLY: bf16 words")
        if not EARLY:
            pdl_wait(PDL)
        pid_k = tl.program_id(1)
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        j_begin, j_end = pid_k * W_SPLIT, tl.minimum(hw, (pid_k + 1) * W_SPLIT)
        if EARLY:
            y = _int4_words_piece_early(x_ptr, p_ptr, sm_ptr, rn, N, K, hw, j_begin, j_end, G,
                                        BLOCK_N, GROUPS, EVEN, PDL, nw_ptr, EPI == 1)
        else:
            y = _int4_words_piece(x_ptr, p_ptr, sm_ptr, rn, N, K, hw, j_begin, j_end, G,
                                  BLOCK_N, GROUPS, EVEN, STAGES, BF16, nw_ptr, EPI == 1)
        pdl_release(PDL)
        if EPI == 1:  # NORMED: the scale is one number per token, applied to the sums
            i = tl.arange(0, SS_N)
            ss = tl.sum(tl.load(ss_ptr + i, mask=i < n_ss, other=0.0), axis=0)
            y = y * (1.0 / tl.sqrt(ss / K + eps))
        if EPI == 2:  # ADDED
            _store_added(y_ptr, res_ptr, ss_ptr, part_ptr, cnt_ptr, y, rn, pid_k, N, PARTIAL)
        else:
            _store_row(y_ptr, part_ptr, cnt_ptr, y, rn, pid_k, N, PARTIAL)

    @triton.jit
    def _stream_pieces(part_ptr, cnt_ptr, t, offs, P, STEPS, UNITS, SIZE: tl.constexpr):
        """Tile t of the stream-K int4 GEMM, cut between programs, after this program
        stored its piece (``offs`` in its slot of SIZE values): (whether this program is
        the last of them to arrive, and then the pieces summed in program order, so the sum
        does not depend on which arrives last; else zeros). The last leaves t's arrival
        counter at 0 for the next launch. Partials: two slots per
        program (its first unit's piece, its last unit's), program p owning units
        [p UNITS / P, (p + 1) UNITS / P) of STEPS steps each."""
        tl.debug_barrier()  # every thread's piece is stored before the release
        # the programs holding a piece of t: the owners of its first and last step
        p_first = ((t * STEPS + 1) * P - 1) // UNITS
        p_last = ((t + 1) * STEPS * P - 1) // UNITS
        arrived = tl.atomic_add(cnt_ptr + t, 1, sem="acq_rel", scope="gpu")
        last = arrived == p_last - p_first
        total = tl.zeros(offs.shape, dtype=tl.float32)
        if last:
            for q in range(p_first, p_last + 1):
                q_slot = (t != (q * UNITS // P) // STEPS).to(tl.int32)
                # .cg: from L2; this multiprocessor's L1 may hold stale lines
                total += tl.load(part_ptr + (q * 2 + q_slot) * SIZE + offs,
                                 cache_modifier=".cg")
            tl.store(cnt_ptr + t, 0)
        return last, total

    @triton.jit
    def _store_row(y_ptr, part_ptr, cnt_ptr, y, rn, pid_k, N, PARTIAL: tl.constexpr):
        """y [BN] (fp32) into y_ptr[rn]; split along K (grid axis 1), through
        ``add_splits``."""
        if PARTIAL:
            add_splits(y_ptr, part_ptr, cnt_ptr, y, rn, rn < N, N, pid_k, tl.num_programs(1),
                       tl.program_id(0))
        else:
            tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=rn < N)

    @triton.jit
    def _store_added(h_ptr, res_ptr, ss_ptr, part_ptr, cnt_ptr, y, rn, pid_k, N,
                     PARTIAL: tl.constexpr):
        """y [BN] (fp32) of rows ``rn`` plus the residual there, rounded as the add +
        RMSNorm kernel rounds them (y in the model dtype first), into h_ptr[rn], and the sum
        of their squares into ss_ptr[row block]; split along K (grid axis 1), by the block's
        last program to arrive (``gather_splits``)."""
        mask = rn < N
        last, total = True, y
        if PARTIAL:
            last, total = gather_splits(part_ptr, cnt_ptr, y, rn, mask, N, pid_k,
                                        tl.num_programs(1), tl.program_id(0))
        if last:
            dt = h_ptr.dtype.element_ty
            r = tl.load(res_ptr + rn, mask=mask, other=0.0).to(tl.float32)
            h = (total.to(dt).to(tl.float32) + r).to(dt)
            tl.store(h_ptr + rn, h, mask=mask)
            hf = h.to(tl.float32)
            tl.store(ss_ptr + tl.program_id(0), tl.sum(hf * hf, axis=0))

    @triton.jit
    def _store_tile(y_ptr, acc, rm, rn, pid_k, M, N, SWAP: tl.constexpr,
                    PARTIAL: tl.constexpr):
        """acc [BM, BN] (or [BN, BM] when SWAP) into y [M, N], or fp32 into the partial
        buffer [SPLIT_K, M, N] at split pid_k (``splits.finish_splits``)."""
        if SWAP:
            offs = rm[None, :] * N + rn[:, None]
            mask = (rm[None, :] < M) & (rn[:, None] < N)
        else:
            offs = rm[:, None] * N + rn[None, :]
            mask = (rm[:, None] < M) & (rn[None, :] < N)
        if PARTIAL:
            tl.store(y_ptr + pid_k * M * N + offs, acc, mask=mask)
        else:
            tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)

    @fast
    @triton.jit
    def _int8_gemm(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, K_SPLIT,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   PARTIAL: tl.constexpr, SWAP: tl.constexpr, PDL: tl.constexpr):
        # y[m, n] = scale[n] * sum_k x[m, k] q[n, k] over this program's K range; weight
        # tiles converted in registers. SWAP: compute y.T = W x.T, the converted weight tile
        # the left operand (which tl.dot can take from registers). PARTIAL: write fp32
        # [SPLIT_K, M, N] partial sums.
        pdl_wait(PDL)
        pid_k = tl.program_id(2)
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        mmask, nmask = rm[:, None] < M, rn[None, :] < N
        k_end = tl.minimum(K, (pid_k + 1) * K_SPLIT)
        if SWAP:
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(pid_k * K_SPLIT, k_end, BLOCK_K):
            k = k0 + rk
            km = k < k_end
            x = tl.load(x_ptr + rm[:, None] * K + k[None, :], mask=mmask & km[None, :],
                        other=0.0)  # [BM, BK]
            if SWAP:
                w = tl.load(w_ptr + rn[:, None] * K + k[None, :],
                            mask=(rn[:, None] < N) & km[None, :], other=0)  # [BN, BK]
                acc = tl.dot(w.to(x.dtype), tl.trans(x), acc)
            else:
                w = tl.load(w_ptr + rn[None, :] * K + k[:, None], mask=nmask & km[:, None],
                            other=0)  # [BK, BN]
                acc = tl.dot(x, w.to(x.dtype), acc)
        pdl_release(PDL)
        s = tl.load(s_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
        if SWAP:
            acc = acc * s[:, None]
        else:
            acc = acc * s[None, :]
        _store_tile(y_ptr, acc, rm, rn, pid_k, M, N, SWAP, PARTIAL)

    @triton.jit
    def _dequant_int4(b, s_lo, z_lo, s_hi, z_hi, MAGIC: tl.constexpr):
        """Both halves' weights from a tile of code bytes b, scales/mins broadcastable to
        it. MAGIC 0: int -> fp32 conversions and fp32 FMAs; 2: in the scales' dtype (the
        model dtype: packed bf16 FMAs on Hopper); 3: as 2, and for bf16 the code comes from
        bf16's exponent trick (bits 0x4300 | n = 128 + n exactly), no conversion at all."""
        bi = b.to(tl.int32)
        if MAGIC == 3 and s_lo.dtype == tl.bfloat16:
            q_lo = ((bi & 15) | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True) - 128.0
            q_hi = ((bi >> 4) | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True) - 128.0
            w_lo = q_lo * s_lo + z_lo
            w_hi = q_hi * s_hi + z_hi
        elif MAGIC >= 2:
            w_lo = (bi & 15).to(s_lo.dtype) * s_lo + z_lo
            w_hi = (bi >> 4).to(s_hi.dtype) * s_hi + z_hi
        else:
            w_lo = (bi & 15).to(tl.float32) * s_lo.to(tl.float32) + z_lo.to(tl.float32)
            w_hi = (bi >> 4).to(tl.float32) * s_hi.to(tl.float32) + z_hi.to(tl.float32)
        return w_lo, w_hi

    @triton.jit
    def _int4_group_dot(acc, x_ptr, p_ptr, sm_ptr, rm, rn, jg, j_end, M, N, K,
                        G: tl.constexpr, MAGIC: tl.constexpr, SWAP: tl.constexpr):
        """acc plus one group's products: the group of G code bytes at column jg of each
        row half (columns from j_end on masked off) becomes both halves' weights
        (q * s + m, scales broadcast along the group) and feeds two tl.dot calls. SWAP:
        acc is [BN, BM] = W x.T, the dequantised weight the left operand."""
        half = K // 2
        hg = half // G
        j = jg + tl.arange(0, G)  # [G]
        jm = j < j_end  # the last step of a range may pass its end
        mmask = rm[:, None] < M
        x_lo = tl.load(x_ptr + rm[:, None] * K + j[None, :],
                       mask=mmask & jm[None, :], other=0.0)  # [BM, G]
        x_hi = tl.load(x_ptr + rm[:, None] * K + half + j[None, :],
                       mask=mmask & jm[None, :], other=0.0)
        sp = sm_ptr + (rn * hg + jg // G) * 4  # [BN]: the group's scale_min record
        sm = (rn < N) & (rn * 0 + jg < j_end)
        s_lo = tl.load(sp, mask=sm, other=0.0)
        z_lo = tl.load(sp + 1, mask=sm, other=0.0)
        s_hi = tl.load(sp + 2, mask=sm, other=0.0)
        z_hi = tl.load(sp + 3, mask=sm, other=0.0)
        if SWAP:
            b = tl.load(p_ptr + rn[:, None] * half + j[None, :],
                        mask=(rn[:, None] < N) & jm[None, :], other=0)  # [BN, G]
            w_lo, w_hi = _dequant_int4(b, s_lo[:, None], z_lo[:, None], s_hi[:, None],
                                       z_hi[:, None], MAGIC)
            acc = tl.dot(w_lo.to(x_lo.dtype), tl.trans(x_lo), acc)
            acc = tl.dot(w_hi.to(x_hi.dtype), tl.trans(x_hi), acc)
        else:
            b = tl.load(p_ptr + rn[None, :] * half + j[:, None],
                        mask=(rn[None, :] < N) & jm[:, None], other=0)  # [G, BN]
            w_lo, w_hi = _dequant_int4(b, s_lo[None, :], z_lo[None, :], s_hi[None, :],
                                       z_hi[None, :], MAGIC)
            acc = tl.dot(x_lo, w_lo.to(x_lo.dtype), acc)
            acc = tl.dot(x_hi, w_hi.to(x_hi.dtype), acc)
        return acc

    @fast
    @triton.jit
    def _int4_gemm(x_ptr, p_ptr, sm_ptr, y_ptr, M, N, K, J_SPLIT, G: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr,
                   MAGIC: tl.constexpr, PARTIAL: tl.constexpr, SWAP: tl.constexpr,
                   PDL: tl.constexpr):
        # One program per output tile (and K range: program_id(2)), GROUPS groups a step.
        pdl_wait(PDL)
        half = K // 2
        pid_k = tl.program_id(2)
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        j_end = tl.minimum(half, (pid_k + 1) * J_SPLIT)
        if SWAP:
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for j0 in range(pid_k * J_SPLIT, j_end, GROUPS * G):
            for gi in tl.static_range(GROUPS):
                acc = _int4_group_dot(acc, x_ptr, p_ptr, sm_ptr, rm, rn, j0 + gi * G,
                                      j_end, M, N, K, G, MAGIC, SWAP)
        pdl_release(PDL)
        _store_tile(y_ptr, acc, rm, rn, pid_k, M, N, SWAP, PARTIAL)

    @fast
    @triton.jit
    def _int4_gemm_stream(x_ptr, p_ptr, sm_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K,
                          TILES_N, STEPS, UNITS, G: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, MAGIC: tl.constexpr,
                          PDL: tl.constexpr):
        # Stream-K: the GEMM's UNITS = tiles x STEPS (tile, K step) units, in tile order,
        # cut into one even range per program of a grid sized to the GPU, so that every
        # multiprocessor gets the same work however many tiles the shape has (a grid of
        # whole tiles leaves part of the last wave idle). A program finishing a whole tile
        # stores it; a tile cut between programs is summed by the last of them to arrive
        # (an arrival counter per tile), each piece's fp32 partial read back in program
        # order so the sum does not depend on which arrives last. Partials: two slots per
        # program of [BLOCK_N, BLOCK_M] (its first tile's piece, its last tile's piece).
        # SWAP layout (acc = W x.T) only.
        pdl_wait(PDL)
        half = K // 2
        P = tl.num_programs(0)
        pid = tl.program_id(0)
        u0 = pid * UNITS // P
        u1 = (pid + 1) * UNITS // P
        first_tile = u0 // STEPS
        offs = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
        u = u0
        while u < u1:
            t = u // STEPS
            s0 = u - t * STEPS
            s1 = tl.minimum(STEPS, s0 + u1 - u)
            rm = (t // TILES_N) * BLOCK_M + tl.arange(0, BLOCK_M)
            rn = (t % TILES_N) * BLOCK_N + tl.arange(0, BLOCK_N)
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for st in range(s0, s1):
                for gi in tl.static_range(GROUPS):
                    acc = _int4_group_dot(acc, x_ptr, p_ptr, sm_ptr, rm, rn,
                                          (st * GROUPS + gi) * G, half, M, N, K, G, MAGIC,
                                          True)
            if s1 - s0 == STEPS:
                _store_tile(y_ptr, acc, rm, rn, 0, M, N, True, False)
            else:
                slot = (t != first_tile).to(tl.int32)
                tl.store(part_ptr + (pid * 2 + slot) * (BLOCK_M * BLOCK_N) + offs, acc)
                last, total = _stream_pieces(part_ptr, cnt_ptr, t, offs, P, STEPS, UNITS,
                                             BLOCK_M * BLOCK_N)
                if last:
                    _store_tile(y_ptr, total, rm, rn, 0, M, N, True, False)
            u += s1 - s0
        pdl_release(PDL)


def _bucket(M: int) -> int:
    """1 for the GEMV; else the GEMM's BLOCK_M (tl.dot needs >= 16 rows)."""
    return 1 if M == 1 else 16 if M <= 16 else 32 if M <= 32 else 64 if M <= 64 else 128


def _split_k(split: int, tiles: int, steps: int, device: torch.device, per_sm: int = 1) -> int:
    """Programs along K: the configured number, or (0) the fewest (a power of two, at most
    4) that give every multiprocessor ``per_sm`` programs, keeping >= 4 loop steps per
    program (each split adds an fp32 [M, N] partial to write and read back). per_sm > 1
    evens out the waves: 192 tiles on 132 multiprocessors leave 60 of them a second one."""
    if split <= 0:
        split = 1
        while (tiles * split < per_sm * multiprocessors(device, 132) and split < 4
               and steps // (split * 2) >= 4):
            split *= 2
    return max(1, min(split, steps))


def _split_range(cfg: dict, M: int, N: int, length: int, step: int, block_m: int,
                 device: torch.device) -> tuple[int, int]:
    """(programs along K, K range per program: a multiple of ``step``) for a GEMM over
    ``length`` of K in steps of ``step``."""
    tiles = triton.cdiv(M, block_m) * triton.cdiv(N, cfg["BLOCK_N"])
    split = _split_k(cfg["SPLIT_K"], tiles, triton.cdiv(length, step), device,
                     cfg.get("SPLIT_TARGET", 1))
    per = triton.cdiv(triton.cdiv(length, step), split) * step
    return triton.cdiv(length, per), per


def _gemv_grid(cfg: dict, N: int, words: int, step: int,
               device: torch.device) -> tuple[int, int, int]:
    """(rows per program, programs along K, words per program) for a word-wise GEMV over
    ``words`` words per row in steps of ``step``. Fewer than ``PROGRAMS_PER_SM`` programs per
    multiprocessor (the 4096-row layers at 16 rows a program leave half the GPU idle) are
    made up by splitting K (``SPLIT_GEMV``, up to 8 ways, >= 2 steps each; the fp32 partial
    sums cost one more small kernel) or else by halving the rows per program."""
    bn, target = cfg["BLOCK_N"], cfg.get("PROGRAMS_PER_SM", 0) * multiprocessors(device, 132)
    steps = triton.cdiv(words, step)
    split = 1
    if cfg.get("SPLIT_GEMV"):
        while triton.cdiv(N, bn) * split < target and split < 8 and steps // (split * 2) >= 2:
            split *= 2
    else:
        while bn > 1 and triton.cdiv(N, bn) < target:
            bn //= 2
    per = triton.cdiv(steps, split) * step
    return bn, triton.cdiv(words, per), per


def _launch_opts(cfg: dict, device: torch.device) -> dict:
    opts = {} if INTERPRET else dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return opts | pdl.launch(device)


def int8_matmul(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                config: dict | None = None) -> torch.Tensor:
    """x [M, K] @ (q [N, K] int8 * scale [N]).T -> [M, N] in x's dtype."""
    M, K = x.shape
    N = q.shape[0]
    x = x.contiguous()
    tile = None if config else skinny_gemm.int8_config_for(M, N, K)
    if tile is not None:  # a measured few-token tile (TMA loads) beats the GEMM below
        return skinny_gemm.skinny_gemm(x, q, None, tile, scale=scale)
    cfg = config or CONFIGS["int8"][_bucket(M)]
    block_m = max(16, _bucket(M))  # a GEMM config at M = 1 pads to 16 rows
    if M == 1 and "MAGIC" in cfg:  # GEMV configs carry MAGIC, GEMM configs SPLIT_K
        bn, bk = cfg["BLOCK_N"], cfg["BLOCK_K"]
        if cfg.get("WORDS") and K % 4 == 0:
            bn, split, per = _gemv_grid(cfg, N, K // 4, bk // 4, x.device)
            out = added_in_kernel(x, M, N, split, triton.cdiv(N, bn))
            _int8_words(x, q, scale, out, cfg, bn, split, per, Prologue())
            return out[0]
        y = torch.empty(M, N, device=x.device, dtype=x.dtype)
        _int8_gemv[(triton.cdiv(N, bn),)](
            x, q, scale, y, N, K, BLOCK_N=bn, BLOCK_K=bk, MAGIC=cfg["MAGIC"],
            EVEN=N % bn == 0 and K % bk == 0, **_launch_opts(cfg, x.device))
        return y
    bn, bk = cfg["BLOCK_N"], cfg["BLOCK_K"]
    split, k_split = _split_range(cfg, M, N, K, bk, block_m, x.device)
    y, out = split_out(x, M, N, split)
    _int8_gemm[(triton.cdiv(M, block_m), triton.cdiv(N, bn), split)](
        x, q, scale, out, M, N, K, k_split, BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk,
        PARTIAL=split > 1, SWAP=cfg.get("SWAP", 0), **_launch_opts(cfg, x.device))
    return finish_splits(y, out, split)


def int8_gemv_fused(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                    prologue: Prologue, config: dict | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """One token through the word-wise int8 GEMV with ``prologue`` fused in (see
    ``gemv``): (y [1, N], the residual to carry) or None where the shape has no entry in
    ``INT8_FUSED`` (and no config is given) or the config is not word-wise or splits K (a
    norm needs whole rows), so the caller runs the steps apart."""
    K = prologue.in_features(x)
    N = q.shape[0]
    cfg = config or INT8_FUSED.get((N, K))
    if not (cfg and cfg.get("WORDS") and "MAGIC" in cfg and K % 4 == 0 and x.shape[0] == 1):
        return None
    bn, split, per = _gemv_grid(cfg, N, K // 4, cfg["BLOCK_K"] // 4, x.device)
    if split > 1:
        return None
    out = added_in_kernel(x, 1, N, 1, triton.cdiv(N, bn))
    return out[0], _int8_words(x, q, scale, out, cfg, bn, 1, per, prologue)


def _int8_words(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                out: tuple[torch.Tensor, torch.Tensor, torch.Tensor], cfg: dict, bn: int,
                split: int, per: int, prologue: Prologue) -> torch.Tensor | None:
    """Launch ``_int8_gemv_words`` (``bn`` rows a program, K split ``split`` ways of ``per``
    words) into ``out`` (``added_in_kernel``'s y, partials, counters); the residual to
    carry."""
    N, kw, bw = q.shape[0], q.shape[1] // 4, cfg["BLOCK_K"] // 4
    r_in, nw, r_out, carried = prologue.args(x)
    _int8_gemv_words[(triton.cdiv(N, bn), split)](
        x, q.view(torch.int32), scale, *out, N, kw, per, r_in, nw, r_out, prologue.eps,
        BLOCK_N=bn, BLOCK_W=bw, EVEN=N % bn == 0 and kw % bw == 0,
        STAGES=cfg.get("STAGES", 1), PARTIAL=split > 1, PRO=prologue.kind,
        XVEC=cfg.get("XVEC", 0), **_launch_opts(cfg, x.device))
    return carried


def _int4_words(x: torch.Tensor, packed: torch.Tensor, scale_min: torch.Tensor, G: int,
                cfg: dict, epi: int = PLAIN, norm_w: torch.Tensor | None = None,
                ss: torch.Tensor | None = None, eps: float = 0.0,
                residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One token x [1, K] through the word-wise int4 GEMV (``_int4_gemv_words``, epilogue
    ``epi``): (y [1, N], and for ADDED the sums of squares by row block [blocks] fp32)."""
    K, N = x.shape[1], packed.shape[0]
    groups = max(1, cfg["BYTES"] // G)  # groups per tile: about BYTES bytes of a row
    bn, split, per = _gemv_grid(cfg, N, K // 8, groups * G // 4, x.device)
    blocks = triton.cdiv(N, bn)
    y, part, cnt = added_in_kernel(x, 1, N, split, blocks)
    out_ss = torch.empty(blocks, device=x.device, dtype=torch.float32) if epi == ADDED else None
    ss_arg = out_ss if epi == ADDED else ss
    bf16 = (x.dtype == scale_min.dtype == torch.bfloat16 and K % 8 == 0
            and (norm_w is None or norm_w.dtype == torch.bfloat16))
    _int4_gemv_words[(blocks, split)](
        x, packed.view(torch.int32), scale_min, y, part, cnt, N, K, K // 8, per, norm_w,
        ss_arg, 0 if ss_arg is None else ss_arg.numel(), residual, eps, G=G, BLOCK_N=bn,
        GROUPS=groups, EVEN=N % bn == 0 and (K // 2) % (groups * G) == 0,
        STAGES=cfg.get("STAGES", 1), BF16=bf16, PARTIAL=split > 1, EPI=epi,
        SS_N=1 if ss_arg is None else triton.next_power_of_2(ss_arg.numel()),
        EARLY=EARLY_WEIGHTS and bf16, **_launch_opts(cfg, x.device))
    return y, out_ss


def _int4_config(G: int, bucket: int) -> dict:
    """The int4 kernel config of group size G for a token-count bucket ("int4-g<G>" over
    "int4")."""
    return CONFIGS.get(f"int4-g{G}", {}).get(bucket) or CONFIGS["int4"][bucket]


def _words_config(G: int) -> dict | None:
    """The one-token config of int4 group size G where it is the word-wise GEMV."""
    cfg = _int4_config(G, 1)
    return cfg if cfg.get("WORDS") else None


def int4_split_norm_runs(x: torch.Tensor, group_size: int) -> bool:
    """Whether ``int4_gemv_added`` / ``int4_gemv_normed`` serve this one-token call."""
    return (SPLIT_NORM and x.shape[0] == 1 and x.device.type == "cuda"
            and _words_config(group_size) is not None)


def int4_gemv_added(x: torch.Tensor, packed: torch.Tensor, scale_min: torch.Tensor,
                    group_size: int, residual: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: (h = x @ W.T + residual [1, N], rounded as the add + RMSNorm kernel rounds
    it, and the sums of squares of h by row block [blocks] fp32, the first half of the next
    RMSNorm: ``int4_gemv_normed`` does the rest)."""
    cfg = _words_config(group_size)
    return _int4_words(x.contiguous(), packed, scale_min, group_size, cfg, ADDED,
                       residual=residual.contiguous())


def int4_gemv_normed(x: torch.Tensor, packed: torch.Tensor, scale_min: torch.Tensor,
                     group_size: int, norm_w: torch.Tensor, ss: torch.Tensor, eps: float
                     ) -> torch.Tensor:
    """One token: rms_norm(x) * norm_w @ W.T [1, N], for x [1, K] whose sums of squares by
    part are ``ss`` (``int4_gemv_added``): the norm's weight multiplies x on its way in, its
    scale the sums on their way out, so no kernel runs the norm over the row first."""
    cfg = _words_config(group_size)
    return _int4_words(x.contiguous(), packed, scale_min, group_size, cfg, NORMED,
                       norm_w=norm_w, ss=ss, eps=eps)[0]


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, scale_min: torch.Tensor,
                group_size: int, config: dict | None = None) -> torch.Tensor:
    """x [M, K] @ W.T with W unpacked from (packed [N, K/2], scale_min [N, K/(2G), 4]) ->
    [M, N]."""
    M, K = x.shape
    N, G = packed.shape[0], group_size
    half = K // 2
    x = x.contiguous()
    bucket = _bucket(M)
    cfg = config or _int4_config(G, bucket)
    block_m = max(16, bucket)
    if M == 1 and "BYTES" in cfg:  # GEMV configs carry BYTES, GEMM configs GROUPS
        groups = max(1, cfg["BYTES"] // G)  # groups per tile: about BYTES bytes of a row
        if cfg.get("WORDS"):
            return _int4_words(x, packed, scale_min, G, cfg)[0]
        y = torch.empty(M, N, device=x.device, dtype=x.dtype)
        bn = cfg["BLOCK_N"]
        even = N % bn == 0 and half % (groups * G) == 0
        _int4_gemv[(triton.cdiv(N, bn),)](
            x, packed, scale_min, y, N, K, G=G, BLOCK_N=bn, GROUPS=groups, MAGIC=cfg["MAGIC"],
            EVEN=even, **_launch_opts(cfg, x.device))
        return y
    bn, groups = cfg["BLOCK_N"], cfg["GROUPS"]
    tiles_n, sms = triton.cdiv(N, bn), multiprocessors(x.device, 132)
    fill = cfg.get("STREAM_K_FROM", 1) * sms  # tiles from which stream-K takes over
    if cfg.get("STREAM_K") and triton.cdiv(M, block_m) * tiles_n >= fill:
        # stream-K where whole tiles alone fill every multiprocessor (at 64 tokens on an
        # H200: gate|up 48.3 against 51.8 us, q|k|v 30.6 against 31.4); with fewer tiles
        # (o, down) split-K's whole-tile pieces won (11.8 against 16.0, 26.9 against 30.9)
        return _int4_stream(x, packed, scale_min, G, cfg, block_m, tiles_n, sms)
    split, j_split = _split_range(cfg, M, N, half, groups * G, block_m, x.device)
    y, out = split_out(x, M, N, split)
    _int4_gemm[(triton.cdiv(M, block_m), tiles_n, split)](
        x, packed, scale_min, out, M, N, K, j_split, G=G, BLOCK_M=block_m, BLOCK_N=bn,
        GROUPS=groups, MAGIC=cfg["MAGIC"], PARTIAL=split > 1, SWAP=cfg.get("SWAP", 0),
        **_launch_opts(cfg, x.device))
    return finish_splits(y, out, split)


def _int4_stream(x: torch.Tensor, packed: torch.Tensor, scale_min: torch.Tensor, G: int,
                 cfg: dict, block_m: int, tiles_n: int, sms: int) -> torch.Tensor:
    """The int4 GEMM as stream-K (``_int4_gemm_stream``) over tiles of ``block_m`` rows by
    BLOCK_N (``tiles_n`` along N), on ``STREAM_K`` programs per multiprocessor (``sms`` of
    them; fewer where the GEMM has fewer (tile, K step) units)."""
    M, K = x.shape
    N, bn, groups = packed.shape[0], cfg["BLOCK_N"], cfg["GROUPS"]
    tiles = triton.cdiv(M, block_m) * tiles_n
    if tiles > COUNTERS:
        raise ValueError(f"{tiles} tiles for stream-K: at most {COUNTERS}")
    steps = triton.cdiv(K // 2, groups * G)
    programs = min(tiles * steps, cfg["STREAM_K"] * sms)
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    part = torch.empty(programs * 2 * block_m * bn, device=x.device, dtype=torch.float32)
    _int4_gemm_stream[(programs,)](
        x, packed, scale_min, y, part, counters(x.device), M, N, K, tiles_n, steps,
        tiles * steps, G=G, BLOCK_M=block_m, BLOCK_N=bn, GROUPS=groups, MAGIC=cfg["MAGIC"],
        **_launch_opts(cfg, x.device))
    return y
