"""Triton kernels over the paged KV cache: store, paged decode (split-KV), varlen prefill.

All kernels read the cache in place through the block table: position ``p`` of sequence
``s`` lives in slot ``block_tables[s, p // block_size] * block_size + p % block_size`` of
``KVCache.data[layer]`` (``[slots, 2, kv_heads, head_dim]``). No kernel gathers a dense
copy of a context, and none reads past a sequence's real context length, so a step costs
what its sequences really hold (not ``max_model_len``).

Quantised caches (int8, fp8_e4m3 stored as uint8 bits) keep a float32 scale per (slot,
K/V, head): the store kernel quantises, the attention kernels load the narrow values,
widen them exactly to the compute dtype (every int8 and e4m3 value is representable in
bf16; an int8 cache is attended in fp16, into which ``_int8_to_fp16`` widens four values
with five integer / f16x2 instructions), and apply the scales to the scores (K) and to
the probabilities (V), so there is no dequantised copy anywhere. int8 V is stored
transposed within each block (``kv_cache.TRANSPOSED_V``), the layout in which its narrow
tile reaches ``tl.dot`` in 16-byte copies.

- ``store_kv``: one program per token, all KV heads; optionally RoPE on q and k first.
  In steps of ``V_T_APART_TOKENS`` or more, int8 V goes through a second kernel, a
  block's worth of tokens per head at a time, which writes each whole block (a prefill
  chunk's inner blocks) as its rows: its transposed layout wants a block's tokens side by
  side.
- ``paged_decode``: flash-decoding. Grid (KV head, sequence, split): each program walks its
  share of the context in tiles of ``block_n`` tokens with an online softmax; the query
  heads of one GQA group form the rows of one ``tl.dot``. With more than one split the
  partial results are merged by log-sum-exp in a second, tiny kernel.
- ``paged_prefill``: causal attention for every prefill chunk of a step in one launch.
  Grid (query tile, query head, chunk); keys are the chunk's cached prefix (prefix-cache
  hits included, from any offset in a block) plus the chunk itself, read back from the
  cache after ``store_kv`` wrote it. Both attention kernels share the tile load
  (``_kv_tile``) and the online-softmax step (``_attend_tile``).

With ``TRITON_INTERPRET=1`` the same kernels run on the CPU (slowly): that is how the tests
check them on machines without a GPU. The interpreter's ``tl.dot`` mishandles bfloat16 and
its float8 conversion rounds differently from the GPU, so under it the dot operands are
widened to float32 (``UPCAST``) and the fp8 store rounds in float32 first (as it does on
the GPU anyway).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from backend.layers import pdl
from backend.layers.fused_ops import rotate_halves
from backend.layers.gpu import multiprocessors
from backend.layers.kv_cache import TRANSPOSED_V
from backend.layers.launch import fast
from backend.layers.pdl import release as pdl_release
from backend.layers.pdl import wait as pdl_wait
from backend.layers.rounding import rint as _rint
from backend.layers.rounding import round_to_e4m3 as _round_to_e4m3

QUANT_CODES = {"auto": 0, "int8": 1, "fp8_e4m3": 2}
_INT8_MAX = 127.0
_FP8_MAX = 448.0
_LOG2E = 1.4426950408889634
# Decode tiles (tokens per loop iteration), warps and software-pipeline depths by cache
# dtype, for split grids (several programs per context) and unsplit ones (batch x KV heads
# fill the GPU): the fastest measured on an H200 (docs/BENCHMARKS.md). CUDA graphs fix the
# split count per batch size, so the choice cannot follow the context length.
# bf16, split: 64 tokens, 2 warps, 3 stages (2-7 % faster than 4 warps and 2 stages; 32
# tokens lost up to 10 % at batch 1-8). bf16, unsplit: 32 tokens and 2 stages, with KV heads
# first 3-6 % faster than 64 / 3 at batch 32-128 x context 544, within 1 % at 4k. int8,
# split: 4 warps (2 lost 3-10 % at 4k). int8, unsplit: one warp a program, 32 tokens, 3
# stages: 13 % faster than 128 / 4 / 3 at batch 64-128 x context 544, equal at 4k (the
# softmax of one query row then needs no reduction across warps); the fastest tile for
# ``DECODE_ROWS``' CUDA-core path too.
DECODE_TILES = {  # kind: (split, unsplit) as (block_n, num_warps, num_stages)
    "auto": ((64, 2, 3), (32, 2, 2)),
    "int8": ((128, 4, 3), (32, 1, 3)),
    "fp8_e4m3": ((128, 4, 2), (128, 4, 2)),
}
# Decode with one query head per KV head (no GQA), per kind for (split, unsplit) grids:
# 0 = the query row padded to 16 for tl.dot; 1 = products and sums on the CUDA cores
# (``_attend_rows``); 2 / 3 = as 1, int8 widened through fp16's / fp32's bit trick
# (``_widen_f32``). int8, unsplit: 3 on the unsplit tile, 74.5 against 111.7 us at batch
# 64 x context 544 on an H200 (3.8 TB/s), 536 against 695 at 64 x 4k; split grids keep
# tl.dot (3 won at 8 x 544, 15.9 against 19.9 us, lost at 8 x 4k, 118.6 against 97.4). bf16:
# tl.dot won at every shape (docs/BENCHMARKS.md).
DECODE_ROWS = {"auto": (0, 0), "int8": (0, 3), "fp8_e4m3": (0, 0)}
# Steps of at least this many tokens store int8 V with ``_store_v_transposed_kernel`` (a
# block's worth of tokens a program, or ``_V_T_TOKENS`` where whole blocks cannot be written
# as rows); smaller ones (decodes: each token in its own block, so nothing to gather) keep
# one kernel for K and V.
V_T_APART_TOKENS = 128
_V_T_TOKENS = 32
# KV heads vary fastest in the decode grid: the programs that run together read the heads
# of the same few sequences, whose K/V rows of a token sit side by side in one slot (0.5-2 %
# faster than sequences first at batch 32-128 with split-free grids).
DECODE_HEADS_FIRST = True
# The decode kernel's first tile of K/V rows that earlier steps stored, loaded before the
# wait for the previous kernel (this step's K/V store) under programmatic dependent launch
# (``_decode_kernel``'s EARLY; float caches on the tl.dot path). Off unless
# ``FIRSTTOKEN_ATTN_EARLY=1``: not yet timed on a GPU.
DECODE_EARLY = os.environ.get("FIRSTTOKEN_ATTN_EARLY", "0") == "1"


def decode_tile(kv_cache_dtype: str, num_splits: int) -> tuple[int, int, int]:
    """(block_n, num_warps, num_stages) of the decode kernel for a cache dtype and grid."""
    split, unsplit = DECODE_TILES[kv_cache_dtype]
    return unsplit if num_splits == 1 else split


@triton.jit
def _int8_to_fp16(x):
    """int8 -> fp16, exactly, four values per 32-bit word in five instructions. A byte
    offset by 128 (one XOR per word) becomes the low byte of an fp16 whose high byte is
    0x64 (one byte permute per pair): 1024 + x + 128, exact; one f16x2 subtraction of 1152
    per pair leaves x. The int8 decode loop issues about as many instructions as it can
    (half the scheduler slots on an H200 at batch 64): Triton's own int8 -> bf16 widening
    took 1,161 instructions per 128-token tile of Llama-2-7B's heads, this 1,050."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 u;
        xor.b32 u, $2, 0x80808080;
        prmt.b32 $0, u, 0x64646464, 0x4140;
        prmt.b32 $1, u, 0x64646464, 0x4342;
        sub.f16x2 $0, $0, $3;
        sub.f16x2 $1, $1, $3;
        }""",
        # $3: 1152 twice as f16x2 (an operand, not an immediate: the subtraction takes
        # registers only; as an operand it is set once, outside the loop)
        constraints="=r,=r,r,r,r,r,r", args=[x, tl.full(x.shape, 0x64806480, tl.int32)],
        dtype=tl.float16, is_pure=True, pack=4)


@triton.jit
def _int8_to_fp32(x):
    """int8 -> fp32, exactly, without I2F (a slow pipe): a byte offset by 128 (one XOR per
    four) becomes the low byte of 2^23's bits (one byte permute each), 2^23 + 128 + x, and
    one subtraction leaves x."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 u;
        xor.b32 u, $4, 0x80808080;
        prmt.b32 $0, u, 0x4B000000, 0x7440;
        prmt.b32 $1, u, 0x4B000000, 0x7441;
        prmt.b32 $2, u, 0x4B000000, 0x7442;
        prmt.b32 $3, u, 0x4B000000, 0x7443;
        sub.f32 $0, $0, 0f4B000080;
        sub.f32 $1, $1, 0f4B000080;
        sub.f32 $2, $2, 0f4B000080;
        sub.f32 $3, $3, 0f4B000080;
        }""",
        constraints="=r,=r,=r,=r,r", args=[x], dtype=tl.float32, is_pure=True, pack=4)


@triton.jit
def _widen(x, QUANT: tl.constexpr, dtype: tl.constexpr):
    """Stored cache values -> the compute dtype (exact for int8 and e4m3)."""
    if QUANT == 2:
        return x.to(tl.float8e4nv, bitcast=True).to(dtype)
    elif QUANT == 1 and dtype == tl.float16 and _PTX_WIDEN:
        return _int8_to_fp16(x)
    else:
        return x.to(dtype)


@triton.jit
def _kv_tile(cache_ptr, bt_row, n, nmask, end, head, d, dmask, stride_cs, stride_cc, stride_ch,
             BLOCK_SIZE: tl.constexpr, HD: tl.constexpr, QUANT: tl.constexpr,
             V_T: tl.constexpr, cdt: tl.constexpr):
    """K and V rows [BLOCK_N, HD_PAD] of positions n < end (through the block table,
    widened to cdt) and their slots [BLOCK_N]. With V_T (int8 caches) V is stored
    transposed within each block (``kv_cache.v_transposed_index``): its tile is loaded as
    [HD_PAD, BLOCK_N] with whole blocks' tokens contiguous, so the narrow values arrive in
    16-byte copies and reach ``tl.dot`` in the layout it reads as B without byte-wise
    shared-memory loads. Its positions past ``end`` read the last page again (finite
    values that the caller gives zero weight), keeping the mask constant along tokens."""
    page, slot = _pages(bt_row, n, nmask, end, BLOCK_SIZE, V_T)
    kv_off = slot[:, None] * stride_cs + head * stride_ch + d[None, :]
    lmask = nmask[:, None] & dmask[None, :]
    k = _widen(tl.load(cache_ptr + kv_off, mask=lmask, other=0), QUANT, cdt)
    if V_T:
        vt_off = _vt_offsets(page, n, d, stride_cs, BLOCK_SIZE, HD)
        vt = tl.load(cache_ptr + head * stride_ch + stride_cc + vt_off, mask=dmask[:, None],
                     other=0)  # [HD_PAD, BLOCK_N]
        v = tl.trans(_widen(vt, QUANT, cdt))
    else:
        v = _widen(tl.load(cache_ptr + kv_off + stride_cc, mask=lmask, other=0), QUANT, cdt)
    return k, v, slot


@triton.jit
def _pages(bt_row, n, nmask, end, BLOCK_SIZE: tl.constexpr, V_T: tl.constexpr):
    """(page, slot) [BLOCK_N] of positions n through the block table. With V_T, positions
    past ``end`` read the last page again (see ``_kv_tile``)."""
    if V_T:
        blk = tl.minimum(n // BLOCK_SIZE, (end - 1) // BLOCK_SIZE)
        page = tl.load(bt_row + blk).to(tl.int64)
    else:
        page = tl.load(bt_row + n // BLOCK_SIZE, mask=nmask, other=0).to(tl.int64)
    return page, page * BLOCK_SIZE + n % BLOCK_SIZE


@triton.jit
def _vt_offsets(page, n, d, stride_cs, BLOCK_SIZE: tl.constexpr, HD: tl.constexpr):
    """Offsets [HD_PAD, BLOCK_N] of V stored transposed within its block: element (d, t)
    of a block at byte d * BLOCK_SIZE + t of its V rows."""
    t = n % BLOCK_SIZE
    base = (page * BLOCK_SIZE)[None, :]
    if HD % BLOCK_SIZE == 0:  # written so that the compiler sees the runs of tokens
        R: tl.constexpr = HD // BLOCK_SIZE  # dims per row
        return (base + (d // R)[:, None]) * stride_cs + ((d % R) * BLOCK_SIZE)[:, None] \
            + t[None, :]
    # a run of tokens may wrap into the next row
    f = d[:, None] * BLOCK_SIZE + t[None, :]
    return (base + f // HD) * stride_cs + f % HD


@triton.jit
def _attend_tile(q, k, v, slot, nmask, visible, m_i, l_i, acc, qk_scale, scale_ptr, head,
                 stride_sc, stride_sh, QUANT: tl.constexpr, DOT_PREC: tl.constexpr,
                 MASKED: tl.constexpr):
    """One online-softmax step (base 2) of the rows q [M, HD_PAD] over one K/V tile;
    with MASKED, visible [M or 1, BLOCK_N] hides keys. Quantised: K scales multiply the
    scores, V scales the probabilities (a tile's scales are contiguous within a block)."""
    if QUANT != 0:  # the K scales and the softmax scale in one product a column
        ks = tl.load(scale_ptr + head * stride_sh + slot, mask=nmask, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * (ks * qk_scale)[None, :]
    else:
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale  # [M, BLOCK_N]
    if MASKED:
        scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(scores - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    vs_off = stride_sc + head * stride_sh + slot
    if QUANT != 0 and v.dtype == tl.float16:
        # p * V scale can fall below fp16's normal range (small scales over long contexts):
        # the tile's largest scale S goes outside the dot, the products stay within [0, 1].
        # (Keeping acc in units of the latest S, so that the dot could accumulate into it,
        # issued fewer instructions but ran the decode loop 18 % slower on an H200.)
        vs = tl.load(scale_ptr + vs_off, mask=nmask, other=0.0)
        top = tl.maximum(tl.max(vs, axis=0), 1e-30)
        pv = tl.dot((p * (vs / top)[None, :]).to(v.dtype), v, input_precision=DOT_PREC)
        acc = acc * alpha[:, None] + pv * top
    else:
        if QUANT != 0:
            p *= tl.load(scale_ptr + vs_off, mask=nmask, other=0.0)[None, :]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
    return m_new, l_i, acc


@fast
@triton.jit
def _store_kv_kernel(
        k_ptr, v_ptr, slot_ptr, cache_ptr, scale_ptr, q_ptr, cos_ptr, sin_ptr,
        stride_kt, stride_kh, stride_vt, stride_vh, stride_qt, stride_qh, stride_c,
        stride_cs, stride_cc, stride_ch, stride_sc, stride_sh,
        KVH: tl.constexpr, HD: tl.constexpr, HALF: tl.constexpr, KVH_PAD: tl.constexpr,
        HALF_PAD: tl.constexpr, H: tl.constexpr, H_PAD: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, QUANT: tl.constexpr, V_T: tl.constexpr,
        ROPE: tl.constexpr, V_APART: tl.constexpr, PDL: tl.constexpr):
    # one program per token, every KV head; rows handled as two halves (RoPE pairs them).
    # V_APART: V is left to ``_store_v_transposed_kernel``.
    pdl_wait(PDL)
    pdl_release(PDL)
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    h = tl.arange(0, KVH_PAD)[:, None]
    d = tl.arange(0, HALF_PAD)[None, :]
    mask = (h < KVH) & (d < HALF)
    k_row = k_ptr + t * stride_kt + h * stride_kh + d
    v_row = v_ptr + t * stride_vt + h * stride_vh + d
    k1 = tl.load(k_row, mask=mask, other=0.0)
    k2 = tl.load(k_row + HALF, mask=mask, other=0.0)
    if ROPE:
        c = tl.load(cos_ptr + t * stride_c + d, mask=d < HALF, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + t * stride_c + d, mask=d < HALF, other=0.0).to(tl.float32)
        k1, k2 = rotate_halves(k1, k2, c, s)
        hq = tl.arange(0, H_PAD)[:, None]
        qmask = (hq < H) & (d < HALF)
        q_row = q_ptr + t * stride_qt + hq * stride_qh + d
        q1, q2 = rotate_halves(tl.load(q_row, mask=qmask, other=0.0),
                               tl.load(q_row + HALF, mask=qmask, other=0.0), c, s)
        tl.store(q_row, q1, mask=qmask)
        tl.store(q_row + HALF, q2, mask=qmask)
    _store_row(cache_ptr, scale_ptr, slot, 0, k1, k2, h, d, mask, stride_cs, stride_cc,
               stride_ch, stride_sc, stride_sh, KVH, HD, HALF, KVH_PAD, BLOCK_SIZE, QUANT, V_T)
    if not V_APART:
        _store_row(cache_ptr, scale_ptr, slot, 1, tl.load(v_row, mask=mask, other=0.0),
                   tl.load(v_row + HALF, mask=mask, other=0.0), h, d, mask, stride_cs,
                   stride_cc, stride_ch, stride_sc, stride_sh, KVH, HD, HALF, KVH_PAD,
                   BLOCK_SIZE, QUANT, V_T)


@fast
@triton.jit
def _store_v_transposed_kernel(v_ptr, slot_ptr, cache_ptr, scale_ptr, T, stride_vt, stride_vh,
                               stride_cs, stride_cc, stride_ch, stride_sc, stride_sh,
                               HD: tl.constexpr, HD_PAD: tl.constexpr, TB: tl.constexpr,
                               BLOCK_SIZE: tl.constexpr, WHOLE_BLOCKS: tl.constexpr,
                               PDL: tl.constexpr):
    # int8 V of TB consecutive tokens of the step, one KV head a program, quantised as
    # ``_store_row`` does (bit for bit) and written transposed within each block. A whole
    # block of tokens in slot order (a prefill chunk's inner blocks) is written as the
    # block's rows, [BLOCK_SIZE, HD] bytes in runs of HD: on an H200 a byte at a time, 16
    # bytes from the next, took 7.6x the bf16 store's time in a 1,024-token prefill step,
    # and tiles of [dims, tokens] still 2.3x. Every other token (partial blocks, decodes)
    # goes out byte by byte.
    pdl_wait(PDL)
    pdl_release(PDL)
    h = tl.program_id(1)
    t = tl.program_id(0) * TB + tl.arange(0, TB)  # [TB]
    tmask = t < T
    d = tl.arange(0, HD_PAD)
    dmask = d < HD
    slot = tl.load(slot_ptr + t, mask=tmask, other=0).to(tl.int64)
    qv, scale = _int8_v_rows(v_ptr, t, tmask, h, d, dmask, stride_vt, stride_vh)
    tl.store(scale_ptr + stride_sc + h * stride_sh + slot, scale, mask=tmask)
    bytewise = tmask
    if WHOLE_BLOCKS:  # TB == BLOCK_SIZE, HD == HD_PAD (``store_kv``)
        # token j belongs to a whole block in order when the BLOCK_SIZE step tokens from
        # j - (its place in the block) hold that block's slots one after the other
        k = tl.arange(0, BLOCK_SIZE)
        first = t - slot % BLOCK_SIZE  # [TB] step index of its block's first token
        run = tl.load(slot_ptr + first[:, None] + k[None, :],
                      mask=tmask[:, None] & (first[:, None] >= 0)
                      & (first[:, None] + k[None, :] < T), other=-1)
        whole = tl.sum((run == (slot - slot % BLOCK_SIZE)[:, None] + k[None, :]).to(tl.int32),
                       axis=1) == BLOCK_SIZE  # [TB]
        bytewise = tmask & ~whole
        # the whole block that starts in this window (at most one: TB == BLOCK_SIZE); when
        # it is the window itself (a chunk's inner blocks, mostly), its codes are at hand
        starts = whole & (slot % BLOCK_SIZE == 0)
        if tl.sum(starts.to(tl.int32), axis=0) > 0:
            r0 = tl.sum(tl.where(starts, t, 0), axis=0)
            base = tl.sum(tl.where(starts, slot, 0), axis=0)
            if r0 == tl.program_id(0) * TB:
                bv = qv
            else:
                bv, _ = _int8_v_rows(v_ptr, r0 + k, k < BLOCK_SIZE, h, d, dmask, stride_vt,
                                     stride_vh)
            # element (dim, token) at byte dim * BLOCK_SIZE + token of the block's rows:
            # the [HD, BLOCK_SIZE] tile read in order as [BLOCK_SIZE, HD]
            rows = tl.reshape(tl.trans(bv), (BLOCK_SIZE, HD_PAD))
            tl.store(cache_ptr + (base + k)[:, None] * stride_cs + stride_cc + h * stride_ch
                     + d[None, :], rows)
    row, col = _transposed_v_place(slot[None, :], d[:, None], BLOCK_SIZE, HD)  # [HD_PAD, TB]
    tl.store(cache_ptr + row * stride_cs + stride_cc + h * stride_ch + col, tl.trans(qv),
             mask=dmask[:, None] & bytewise[None, :])


@triton.jit
def _int8_v_rows(v_ptr, t, tmask, h, d, dmask, stride_vt, stride_vh):
    """V rows of step tokens t, head h -> int8 codes [TB, HD_PAD] and their scales [TB]."""
    v = tl.load(v_ptr + t[:, None] * stride_vt + h * stride_vh + d[None, :],
                mask=tmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(v), axis=1) / 127.0, 1e-12)  # [TB]
    return _int8_codes(v / scale[:, None]), scale


@triton.jit
def _int8_codes(y):
    """y (already divided by its scale) rounded half to even and clamped to +-127, as int8."""
    return tl.minimum(tl.maximum(_rint(y), -127.0), 127.0).to(tl.int8)


@triton.jit
def _transposed_v_place(slot, dim, BLOCK_SIZE: tl.constexpr, HD: tl.constexpr):
    """(cache row, byte within the row) of dimension ``dim`` of the token in ``slot`` when V
    is stored transposed within its block (``_kv_tile``): byte dim * BLOCK_SIZE + t of the
    block's V rows, t the token's place in the block."""
    f = dim * BLOCK_SIZE + slot % BLOCK_SIZE
    return slot - slot % BLOCK_SIZE + f // HD, f % HD


@triton.jit
def _store_row(cache_ptr, scale_ptr, slot, c: tl.constexpr, x1, x2, h, d, mask,
               stride_cs, stride_cc, stride_ch, stride_sc, stride_sh,
               KVH: tl.constexpr, HD: tl.constexpr, HALF: tl.constexpr, KVH_PAD: tl.constexpr,
               BLOCK_SIZE: tl.constexpr, QUANT: tl.constexpr, V_T: tl.constexpr):
    """K (c = 0) or V (c = 1) of one token, every head, as halves [KVH_PAD, HALF_PAD] ->
    the cache (quantised with one scale per head when the cache is)."""
    dst = cache_ptr + slot * stride_cs + c * stride_cc + h * stride_ch + d
    if QUANT == 0:
        tl.store(dst, x1.to(cache_ptr.dtype.element_ty), mask=mask)
        tl.store(dst + HALF, x2.to(cache_ptr.dtype.element_ty), mask=mask)
    else:
        top = 127.0 if QUANT == 1 else 448.0
        a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
        amax = tl.maximum(tl.max(tl.abs(a1), axis=1), tl.max(tl.abs(a2), axis=1))
        scale = tl.maximum(amax / top, 1e-12)  # [KVH_PAD]
        for part in tl.static_range(2):
            y = (a1 if part == 0 else a2) / scale[:, None]
            if QUANT == 1:
                qv = _int8_codes(y)
            else:
                qv = _round_to_e4m3(y).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
            if c == 0 or not V_T:
                tl.store(dst + part * HALF, qv, mask=mask)
            else:
                row, col = _transposed_v_place(slot, d + part * HALF, BLOCK_SIZE, HD)
                tl.store(cache_ptr + row * stride_cs + stride_cc + h * stride_ch + col, qv,
                         mask=mask)
        hs = tl.arange(0, KVH_PAD)
        tl.store(scale_ptr + c * stride_sc + hs * stride_sh + slot, scale, mask=hs < KVH)


@triton.jit
def _attend_rows(q, cache_ptr, scale_ptr, bt_row, start, end, head, d, dmask, qk_scale,
                 stride_cs, stride_cc, stride_ch, stride_sc, stride_sh,
                 BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HD: tl.constexpr,
                 QUANT: tl.constexpr, V_T: tl.constexpr, WIDEN: tl.constexpr):
    """The online softmax of one query row q [1, HD_PAD] over positions [start, end): each
    score a sum of fp32 products, each output a sum of probability-weighted values, on the
    CUDA cores. tl.dot would pad the row to 16 and stage every K/V tile through shared
    memory for the tensor cores; with one row the products are as many as the loaded values.
    Stored values are widened to fp32 (exact for int8, e4m3 and the 16-bit dtypes;
    ``_widen_f32``); the K scales multiply the scores, the V scales the probabilities.
    Returns (m [1], l [1], acc [1, HD_PAD]) as the tl.dot path does."""
    qv = tl.sum(q.to(tl.float32), axis=0)  # [HD_PAD]: the one row
    m = tl.max(tl.full([BLOCK_N], float("-inf"), tl.float32), axis=0)
    l_sum = tl.sum(tl.zeros([BLOCK_N], tl.float32), axis=0)
    acc = tl.zeros_like(qv)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nmask = n < end
        page, slot = _pages(bt_row, n, nmask, end, BLOCK_SIZE, V_T)
        kv_off = slot[:, None] * stride_cs + head * stride_ch + d[None, :]
        lmask = nmask[:, None] & dmask[None, :]
        k = _widen_f32(tl.load(cache_ptr + kv_off, mask=lmask, other=0), QUANT, WIDEN)
        scores = tl.sum(k * qv[None, :], axis=1)  # [BLOCK_N]
        if QUANT != 0:
            ks = tl.load(scale_ptr + head * stride_sh + slot, mask=nmask, other=0.0)
            scores = scores * (ks * qk_scale)
        else:
            scores = scores * qk_scale
        scores = tl.where(nmask, scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=0))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new)
        l_sum = l_sum * alpha + tl.sum(p, axis=0)
        if QUANT != 0:
            p = p * tl.load(scale_ptr + stride_sc + head * stride_sh + slot, mask=nmask,
                            other=0.0)
        if V_T:  # [HD_PAD, BLOCK_N], a block's tokens contiguous (see ``_kv_tile``)
            vt_off = _vt_offsets(page, n, d, stride_cs, BLOCK_SIZE, HD)
            vt = _widen_f32(tl.load(cache_ptr + head * stride_ch + stride_cc + vt_off,
                                    mask=dmask[:, None], other=0), QUANT, WIDEN)
            acc = acc * alpha + tl.sum(vt * p[None, :], axis=1)
        else:
            v = _widen_f32(tl.load(cache_ptr + kv_off + stride_cc, mask=lmask, other=0),
                           QUANT, WIDEN)
            acc = acc * alpha + tl.sum(v * p[:, None], axis=0)
        m = m_new
    return tl.zeros([1], tl.float32) + m, tl.zeros([1], tl.float32) + l_sum, acc[None, :]


@triton.jit
def _widen_f32(x, QUANT: tl.constexpr, WIDEN: tl.constexpr):
    """Stored cache values -> fp32 (exact). int8: WIDEN 2 through fp16's bit trick
    (``_int8_to_fp16``), 3 through fp32's (``_int8_to_fp32``), else a conversion."""
    if QUANT == 1 and WIDEN == 2 and _PTX_WIDEN:
        return _int8_to_fp16(x).to(tl.float32)
    elif QUANT == 1 and WIDEN == 3 and _PTX_WIDEN:
        return _int8_to_fp32(x)
    return _widen(x, QUANT, tl.float32)


# The block-table row stride changes with the step's longest context: not specialised, so
# a new width never triggers a recompile (a stall) mid-run.
@fast
@triton.jit(do_not_specialize=["stride_bt"])
def _decode_kernel(
        q_ptr, cache_ptr, scale_ptr, bt_ptr, ctx_ptr, out_ptr, part_o_ptr, part_lse_ptr,
        qk_scale,
        stride_qt, stride_qh, stride_bt, stride_cs, stride_cc, stride_ch, stride_sc, stride_sh,
        stride_ot, stride_oh,
        GROUP: tl.constexpr, G_PAD: tl.constexpr, HD: tl.constexpr, HD_PAD: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
        QUANT: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr, V_T: tl.constexpr,
        HEADS_FIRST: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr,
        EARLY: tl.constexpr = False):
    # EARLY (a float cache on the tl.dot path): a program whose share of the context ends
    # before the step's own token loads its first tile before the wait for the previous
    # kernel (this step's K/V store, which writes only that token's row); q after it
    tl.static_assert(not EARLY or (QUANT == 0 and not ROWS), "EARLY: float cache, tl.dot")
    if not EARLY:
        pdl_wait(PDL)
    if HEADS_FIRST:  # grid (KV head, sequence, split)
        h = tl.program_id(0)
        b = tl.program_id(1)
    else:  # grid (sequence, KV head, split)
        b = tl.program_id(0)
        h = tl.program_id(1)
    s = tl.program_id(2)
    ctx = tl.load(ctx_ptr + b)
    per_split = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = s * per_split
    end = tl.minimum(start + per_split, ctx)

    g = tl.arange(0, G_PAD)
    d = tl.arange(0, HD_PAD)
    dmask = d < HD
    heads = h * GROUP + g  # [G_PAD] query heads of this KV head's group
    # fp32 under the interpreter and for fp32 models; fp16 over an int8 cache (widened by
    # ``_int8_to_fp16``: int8 values and bf16 queries of normal magnitude are exact in it)
    qdt: tl.constexpr = q_ptr.dtype.element_ty
    cdt: tl.constexpr = tl.float32 if UPCAST else (
        qdt if QUANT != 1 or qdt == tl.float32 else tl.float16)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    if EARLY:
        # a program whose share ends before the step's token: its tiles hold only rows of
        # earlier steps (the others load nothing here)
        early_end = tl.where(end < ctx, end, start)
        n = start + tl.arange(0, BLOCK_N)
        nmask = n < early_end
        k0, v0, slot0 = _kv_tile(cache_ptr, bt_row, n, nmask, end, h, d, dmask, stride_cs,
                                 stride_cc, stride_ch, BLOCK_SIZE, HD, QUANT, V_T, cdt)
        pdl_wait(PDL)
    q = tl.load(q_ptr + b * stride_qt + heads[:, None] * stride_qh + d[None, :],
                mask=(g[:, None] < GROUP) & dmask[None, :], other=0.0)  # [G_PAD, HD_PAD]
    q = q.to(cdt)

    if ROWS:  # one query row (GROUP 1, G_PAD 1): sums on the CUDA cores, no tl.dot
        m_i, l_i, acc = _attend_rows(q, cache_ptr, scale_ptr, bt_row, start, end, h, d, dmask,
                                     qk_scale, stride_cs, stride_cc, stride_ch, stride_sc,
                                     stride_sh, BLOCK_SIZE, BLOCK_N, HD, QUANT, V_T, ROWS)
    else:
        m_i = tl.full([G_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([G_PAD], tl.float32)
        acc = tl.zeros([G_PAD, HD_PAD], tl.float32)
        first = start
        if EARLY:
            if start < early_end:  # the first tile, loaded above
                m_i, l_i, acc = _attend_tile(q, k0, v0, slot0, nmask, nmask[None, :], m_i,
                                             l_i, acc, qk_scale, scale_ptr, h, stride_sc,
                                             stride_sh, QUANT, DOT_PREC, True)
                first = start + BLOCK_N
        for n0 in range(first, end, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            nmask = n < end
            k, v, slot = _kv_tile(cache_ptr, bt_row, n, nmask, end, h, d, dmask, stride_cs,
                                  stride_cc, stride_ch, BLOCK_SIZE, HD, QUANT, V_T, cdt)
            m_i, l_i, acc = _attend_tile(q, k, v, slot, nmask, nmask[None, :], m_i, l_i, acc,
                                         qk_scale, scale_ptr, h, stride_sc, stride_sh, QUANT,
                                         DOT_PREC, True)
    pdl_release(PDL)

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]
    gmask = g < GROUP
    if NUM_SPLITS == 1:
        tl.store(out_ptr + b * stride_ot + heads[:, None] * stride_oh + d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=gmask[:, None] & dmask[None, :])
    else:
        # partials [B, H, NUM_SPLITS, HD_PAD] and log2-sum-exp [B, H, NUM_SPLITS]
        kvh = tl.num_programs(0) if HEADS_FIRST else tl.num_programs(1)
        row = (b * kvh * GROUP + heads) * NUM_SPLITS + s  # [G_PAD]
        tl.store(part_o_ptr + row[:, None] * HD_PAD + d[None, :], o, mask=gmask[:, None])
        lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(part_lse_ptr + row, lse, mask=gmask)


@fast
@triton.jit
def _merge_kernel(part_o_ptr, part_lse_ptr, out_ptr, stride_ot, stride_oh,
                  HD: tl.constexpr, HD_PAD: tl.constexpr, NUM_SPLITS: tl.constexpr,
                  PDL: tl.constexpr):
    pdl_wait(PDL)
    pdl_release(PDL)
    b = tl.program_id(0)
    hq = tl.program_id(1)
    row = b * tl.num_programs(1) + hq
    s = tl.arange(0, NUM_SPLITS)
    d = tl.arange(0, HD_PAD)
    lse = tl.load(part_lse_ptr + row * NUM_SPLITS + s)  # [S]
    top = tl.max(lse, axis=0)
    w = tl.exp2(lse - top)  # empty splits: exp2(-inf) = 0
    o = tl.load(part_o_ptr + (row * NUM_SPLITS + s)[:, None] * HD_PAD + d[None, :])
    res = tl.sum(o * w[:, None], axis=0) / tl.sum(w, axis=0)
    tl.store(out_ptr + b * stride_ot + hq * stride_oh + d, res.to(out_ptr.dtype.element_ty),
             mask=d < HD)


@fast
@triton.jit(do_not_specialize=["stride_bt"])
def _prefill_kernel(
        q_ptr, cache_ptr, scale_ptr, bt_ptr, ctx_ptr, qsl_ptr, out_ptr,
        qk_scale, C,
        stride_qt, stride_qh, stride_bt, stride_cs, stride_cc, stride_ch, stride_sc, stride_sh,
        stride_ot, stride_oh,
        GROUP: tl.constexpr, HD: tl.constexpr, HD_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, C_PAD: tl.constexpr,
        QUANT: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
        V_T: tl.constexpr):
    # Grid (query head, tile). The C chunks' query tiles are numbered in one range: chunk
    # c's start at (qsl[c] - qsl[0]) // BLOCK_M + c, which leaves room for its
    # cdiv(q_len, BLOCK_M) tiles whatever the chunks' lengths, so a graphed step's grid
    # needs T / BLOCK_M + C tiles, not max_query_len / BLOCK_M for each of its C chunk slots
    # (one 512-token prompt in 8 slots: 128 real programs and 896 empty ones, which ran in
    # waves after the real ones; on an H200 26.2 us -> 19.0 us per layer, though the same
    # prompt alone in its grid went 16.0 -> 19.0 us). Heads vary fastest, so tiles start in
    # order; within a chunk they run from its end, whose causal rows see the most keys: the
    # longest first.
    hq = tl.program_id(0)
    t = tl.program_id(1)
    ci = tl.arange(0, C_PAD)
    qs = tl.load(qsl_ptr + ci, mask=ci <= C, other=0)  # [C_PAD]: C + 1 row offsets
    starts = (qs - tl.load(qsl_ptr)) // BLOCK_M + ci
    c = tl.sum(((starts <= t) & (ci >= 1) & (ci < C)).to(tl.int32), axis=0)
    q_start = tl.sum(tl.where(ci == c, qs, 0), axis=0)
    q_len = tl.sum(tl.where(ci == c + 1, qs, 0), axis=0) - q_start
    tile = t - tl.sum(tl.where(ci == c, starts, 0), axis=0)  # of the chunk, from its start
    n_tiles = tl.cdiv(q_len, BLOCK_M)
    live = tile < n_tiles  # a tile past the chunk's end runs no iteration, stores nothing
    hk = hq // GROUP
    ctx = tl.load(ctx_ptr + c)
    prefix = ctx - q_len  # position of the chunk's first query
    # first query row: tiles from the chunk's end; a dead tile's rows are all past it
    m0 = tl.where(live, (n_tiles - 1 - tile) * BLOCK_M, q_len)

    m = m0 + tl.arange(0, BLOCK_M)
    mmask = m < q_len
    d = tl.arange(0, HD_PAD)
    dmask = d < HD
    q = tl.load(q_ptr + (q_start + m)[:, None].to(tl.int64) * stride_qt + hq * stride_qh
                + d[None, :], mask=mmask[:, None] & dmask[None, :], other=0.0)
    # fp32 under the interpreter and for fp32 models; fp16 over an int8 cache (widened by
    # ``_int8_to_fp16``: int8 values and bf16 queries of normal magnitude are exact in it)
    cdt: tl.constexpr = tl.float32 if UPCAST else (
        q.dtype if QUANT != 1 or q.dtype == tl.float32 else tl.float16)
    q = q.to(cdt)
    pos = prefix + m  # [BLOCK_M] absolute positions of the queries

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HD_PAD], tl.float32)
    bt_row = bt_ptr + c.to(tl.int64) * stride_bt
    # Keys [0, full_end) are seen by every query of the tile: whole tiles, no mask. Then the
    # tiles up to the last query's position, masked causally. Tiles past the chunk: none.
    full_end = tl.where(live, ((prefix + m0) // BLOCK_N) * BLOCK_N, 0)
    diag_end = tl.where(live, tl.minimum(ctx, prefix + m0 + BLOCK_M), 0)
    for n0 in range(0, full_end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        k, v, slot = _kv_tile(cache_ptr, bt_row, n, n < full_end, full_end, hk, d, dmask,
                              stride_cs, stride_cc, stride_ch, BLOCK_SIZE, HD, QUANT, V_T, cdt)
        m_i, l_i, acc = _attend_tile(q, k, v, slot, n < full_end, None, m_i, l_i, acc,
                                     qk_scale, scale_ptr, hk, stride_sc, stride_sh, QUANT,
                                     DOT_PREC, False)
    for n0 in range(full_end, diag_end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nmask = n < diag_end
        k, v, slot = _kv_tile(cache_ptr, bt_row, n, nmask, diag_end, hk, d, dmask, stride_cs,
                              stride_cc, stride_ch, BLOCK_SIZE, HD, QUANT, V_T, cdt)
        visible = (n[None, :] <= pos[:, None]) & nmask[None, :]  # causal  [BM, BN]
        m_i, l_i, acc = _attend_tile(q, k, v, slot, nmask, visible, m_i, l_i, acc, qk_scale,
                                     scale_ptr, hk, stride_sc, stride_sh, QUANT, DOT_PREC,
                                     True)

    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + (q_start + m)[:, None].to(tl.int64) * stride_ot + hq * stride_oh
             + d[None, :], o.to(out_ptr.dtype.element_ty),
             mask=mmask[:, None] & dmask[None, :])


def _pad(n: int, least: int = 16) -> int:
    return max(least, triton.next_power_of_2(n))


def interpreting() -> bool:
    """True when TRITON_INTERPRET=1 runs the kernels on the CPU."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


# int8 -> fp16 through inline PTX (``_int8_to_fp16``); the interpreter runs no PTX and
# converts instead (the same values: the widening is exact either way). Fixed at import, so
# a test that runs the GPU's fp16 path in the interpreter (UPCAST off) still converts.
# The launches read the switch from here too, fixed at import as Triton's own is.
_INTERPRETING = interpreting()
_PTX_WIDEN = tl.constexpr(not _INTERPRETING)


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 models get exact products (the fp32 parity tests); tf32 would round them.
    return "ieee" if dtype == torch.float32 or _INTERPRETING else "tf32"


def _scales(scales: torch.Tensor | None, cache: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """(scale tensor or a dummy, K/V stride, head stride) of one layer's [2, kvh, slots]."""
    if scales is None:
        return cache, 0, 0
    return scales, scales.stride(0), scales.stride(1)


def store_kv(k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor, cache: torch.Tensor,
             scales: torch.Tensor | None, kv_cache_dtype: str, block_size: int,
             rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
             dependent_launch: bool = False) -> None:
    """k, v: [T, kvh, hd] (any row stride); slots: [T]; cache: one layer's
    [slots, 2, kvh, hd] (int8: V transposed within each block of ``block_size`` slots,
    ``kv_cache.TRANSPOSED_V``); scales: [2, kvh, slots] float32 or None.
    ``rope``: (q [T, H, hd], cos, sin [T, hd]) when q and k are not rotated yet: q is
    rotated in place and k as it is stored (the cache holds rotated keys; ``k`` itself is
    left as it was), bit for bit as ``fused_ops.rope_triton_`` would."""
    T, kvh, hd = k.shape
    if T == 0:
        return
    sc, ssc, ssh = _scales(scales, cache)
    q, cos, sin = rope if rope is not None else (k, k, k)  # dummies when not rotating
    if rope is not None:
        assert q.stride(2) == 1 and cos.stride(1) == 1 and cos.stride() == sin.stride()
    H = q.shape[1]
    v_t = kv_cache_dtype in TRANSPOSED_V
    v_apart = v_t and T >= V_T_APART_TOKENS
    _store_kv_kernel[(T,)](
        k, v, slots, cache, sc, q, cos, sin, k.stride(0), k.stride(1), v.stride(0),
        v.stride(1), q.stride(0), q.stride(1), cos.stride(0),
        cache.stride(0), cache.stride(1), cache.stride(2), ssc, ssh,
        KVH=kvh, HD=hd, HALF=hd // 2, KVH_PAD=triton.next_power_of_2(kvh),
        HALF_PAD=triton.next_power_of_2(hd // 2), H=H, H_PAD=triton.next_power_of_2(H),
        BLOCK_SIZE=block_size, QUANT=QUANT_CODES[kv_cache_dtype], V_T=v_t,
        ROPE=rope is not None, V_APART=v_apart, num_warps=4 if kvh * hd >= 2048 else 1,
        **pdl.launch(k.device, dependent_launch))
    if v_apart:
        # whole blocks as rows: a power-of-two block (a window is one block's size) and a
        # power-of-two head_dim (a block's rows then hold no padding)
        whole = (block_size & (block_size - 1) == 0 and 8 <= block_size <= 64
                 and hd & (hd - 1) == 0)
        tb = block_size if whole else _V_T_TOKENS
        _store_v_transposed_kernel[(triton.cdiv(T, tb), kvh)](
            v, slots, cache, sc, T, v.stride(0), v.stride(1), cache.stride(0), cache.stride(1),
            cache.stride(2), ssc, ssh, HD=hd, HD_PAD=triton.next_power_of_2(hd),
            TB=tb, BLOCK_SIZE=block_size, WHOLE_BLOCKS=whole, num_warps=4,
            **pdl.launch(k.device, dependent_launch))


# A step run outside a CUDA graph (its longest context known on the host) decodes a bf16
# cache unsplit up to this many tokens. There the host launches every kernel and is the
# bottleneck of small batches, and a split costs it the merge kernel's launch and two
# partial buffers: 55 against 29 us of host time a layer (batch 8, context 100, H200),
# against 11 us of GPU time at batch 8 x 544 tokens (34 against 23 us) and 15 at batch 1
# (22 against 7). Longer contexts split as before (at 2,048 tokens unsplit took 79 against
# 11 us at batch 1).
EAGER_UNSPLIT_MAX_TOKENS = 1024
# The cache kinds decoded unsplit outside CUDA graphs (up to EAGER_UNSPLIT_MAX_TOKENS), each
# with the (tile, rows mode) of a grid of fewer than two programs a multiprocessor (a small
# batch; None: the kind's unsplit tile and rows mode). A kind not listed splits as inside
# graphs. int8: the unsplit tile (one warp a program, made for batches of 64-128) lost on
# the GPU at batch 8 what the host saved (docs/BENCHMARKS.md "The eager step's host cost");
# 128 tokens on 8 warps with the CUDA-core rows took 16.4 us of GPU time against the split
# grid's 20.4 at batch 8 x 544 on an H100, and 29-45 against 72-81 us of host time a call
# (batch 1: 12.2 against 8.5 us GPU, 42 against 69 host; 4 x 1,024: 19.2 against 16.4 GPU).
EAGER_UNSPLIT: dict[str, tuple[tuple[int, int, int], int] | None] = {
    "auto": None, "int8": ((128, 8, 3), 3)}


def _twice_the_gpu(device: torch.device) -> int:
    """Programs that fill the GPU about twice (two a multiprocessor): the split rule's aim,
    and the bound under which an unsplit grid takes its kind's small-batch tile."""
    return 2 * multiprocessors(device, 2)


def decode_splits(batch: int, kv_heads: int, max_context: int | None,
                  device: torch.device, kv_cache_dtype: str = "auto",
                  block_n: int = 64) -> int:
    """Splits of each context so that batch x kv_heads x splits fills the GPU about twice.
    Depends on the batch only inside CUDA graphs (``max_context`` None: a graph fixes it
    per batch size). Outside them capped by the longest context (no split without a tile
    of ``block_n`` tokens to work on), and the contexts of the kinds in ``EAGER_UNSPLIT``
    up to ``EAGER_UNSPLIT_MAX_TOKENS`` are not split."""
    eager = max_context is not None
    if eager and kv_cache_dtype in EAGER_UNSPLIT and max_context <= EAGER_UNSPLIT_MAX_TOKENS:
        return 1
    splits = min(16, triton.next_power_of_2(-(-_twice_the_gpu(device) // (batch * kv_heads))))
    if eager:
        splits = min(splits, triton.next_power_of_2(-(-max_context // block_n)))
    return max(1, splits)


def paged_decode(q: torch.Tensor, cache: torch.Tensor, scales: torch.Tensor | None,
                 block_tables: torch.Tensor, context_lens: torch.Tensor, out: torch.Tensor,
                 scale: float, block_size: int, kv_cache_dtype: str, num_splits: int,
                 block_n: int | None = None, num_warps: int | None = None,
                 num_stages: int | None = None, dependent_launch: bool = False,
                 heads_first: bool | None = None, rows: int | None = None,
                 early: bool | None = None) -> torch.Tensor:
    """q: [B, H, hd]; block_tables: [B, W] int32; context_lens: [B] int32 (>= 1);
    out: [B, H, hd] (written). One KV head's query group per program (padded to the 16 rows
    tl.dot needs: decode is bound by the K/V reads, not by the products); num_splits a
    power of two. The tile defaults to ``decode_tile`` (its size sets the summation order),
    the grid order (``heads_first``: KV heads fastest) to ``DECODE_HEADS_FIRST`` and
    ``early`` (the first tile loaded before the wait for the previous kernel; float caches
    with the query rows on tl.dot) to ``DECODE_EARLY`` (the same bits either way)."""
    B, H, hd = q.shape
    kvh = cache.shape[2]
    group = H // kvh
    tile_n, tile_warps, tile_stages = decode_tile(kv_cache_dtype, num_splits)
    few = EAGER_UNSPLIT.get(kv_cache_dtype) if num_splits == 1 else None
    if few is not None and B * kvh < _twice_the_gpu(q.device):
        # an unsplit grid of a small batch (outside graphs): its own tile and rows mode
        (tile_n, tile_warps, tile_stages), few_rows = few
        rows = few_rows if rows is None else rows
    block_n = block_n or tile_n
    num_warps = num_warps or tile_warps
    num_stages = num_stages or tile_stages
    hd_pad = _pad(hd)
    sc, ssc, ssh = _scales(scales, cache)
    if num_splits > 1:
        part_o = torch.empty(B, H, num_splits, hd_pad, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(B, H, num_splits, dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = out  # unused
    if heads_first is None:
        heads_first = DECODE_HEADS_FIRST
    if rows is None:
        rows = DECODE_ROWS[kv_cache_dtype][num_splits == 1]
    rows = rows if group == 1 else 0
    quant = QUANT_CODES[kv_cache_dtype]
    early = (DECODE_EARLY if early is None else early) and quant == 0 and not rows
    grid = (kvh, B, num_splits) if heads_first else (B, kvh, num_splits)
    _decode_kernel[grid](
        q, cache, sc, block_tables, context_lens, out, part_o, part_lse, scale * _LOG2E,
        q.stride(0), q.stride(1), block_tables.stride(0), cache.stride(0), cache.stride(1),
        cache.stride(2), ssc, ssh, out.stride(0), out.stride(1),
        GROUP=group, G_PAD=1 if rows else _pad(group), HD=hd, HD_PAD=hd_pad,
        BLOCK_SIZE=block_size,
        BLOCK_N=block_n, NUM_SPLITS=num_splits, QUANT=quant,
        DOT_PREC=_dot_precision(q.dtype), UPCAST=_INTERPRETING,
        V_T=kv_cache_dtype in TRANSPOSED_V, HEADS_FIRST=heads_first, ROWS=rows, EARLY=early,
        num_warps=num_warps,
        num_stages=num_stages, **pdl.launch(q.device, dependent_launch))
    if num_splits > 1:
        _merge_kernel[(B, H)](part_o, part_lse, out, out.stride(0), out.stride(1), HD=hd,
                              HD_PAD=hd_pad, NUM_SPLITS=num_splits, num_warps=1,
                              **pdl.launch(q.device, dependent_launch))
    return out


def paged_prefill(q: torch.Tensor, cache: torch.Tensor, scales: torch.Tensor | None,
                  block_tables: torch.Tensor, context_lens: torch.Tensor,
                  query_start_loc: torch.Tensor, out: torch.Tensor,
                  scale: float, block_size: int, kv_cache_dtype: str,
                  block_m: int | None = None, block_n: int | None = None,
                  num_warps: int | None = None, num_stages: int = 2) -> torch.Tensor:
    """q: [T, H, hd] (the flat batch; rows outside the chunks untouched); block_tables:
    [C, W]; context_lens: [C] (prefix + chunk); query_start_loc: [C + 1] rows of each
    chunk in q; out: [T, H, hd]."""
    H, hd = q.shape[1], q.shape[2]
    C = context_lens.shape[0]
    kvh = cache.shape[2]
    hd_pad = _pad(hd)
    if block_m is None:
        # int8: 64-row tiles (4 warps) took 15-20 % less time than 128-row ones on an H200
        # in 512-1,024-token prefills (docs/BENCHMARKS.md): widening and scaling make each
        # int8 tile cost more than a bf16 one, and the smaller programs keep more in flight
        block_m = 128 if q.is_cuda and kv_cache_dtype != "int8" else 64
    if block_n is None:
        block_n = 64 if hd_pad <= 128 or not q.is_cuda else 32
    if num_warps is None:
        num_warps = 8 if block_m >= 128 else 4
    sc, ssc, ssh = _scales(scales, cache)
    # every chunk's tiles in one range (see the kernel): T / BLOCK_M + C holds them all
    grid = (H, q.shape[0] // block_m + C)
    _prefill_kernel[grid](
        q, cache, sc, block_tables, context_lens, query_start_loc, out, scale * _LOG2E, C,
        q.stride(0), q.stride(1), block_tables.stride(0), cache.stride(0), cache.stride(1),
        cache.stride(2), ssc, ssh, out.stride(0), out.stride(1),
        GROUP=H // kvh, HD=hd, HD_PAD=hd_pad, BLOCK_SIZE=block_size, BLOCK_M=block_m,
        BLOCK_N=block_n, C_PAD=triton.next_power_of_2(C + 1),
        QUANT=QUANT_CODES[kv_cache_dtype], DOT_PREC=_dot_precision(q.dtype),
        UPCAST=_INTERPRETING, V_T=kv_cache_dtype in TRANSPOSED_V, num_warps=num_warps,
        num_stages=num_stages)
    return out
