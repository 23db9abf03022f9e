"""The CPU path of the packed weight formats for many rows (prefill): dequantise the layer's
weight into a reusable scratch buffer, one block of output rows at a time, and run the dense
matmul (oneDNN) on it.

torch's packed CPU kernels (``_weight_int8pack_mm``, ``_weight_int4pack_mm_for_cpu``) read
the codes directly and win while few rows share each weight (decode), but at hundreds of
rows they lose to the dense matmul by 2-3x; dequantising costs one pass over the weight per
call, which a large matmul amortises (crossover measured in ``docs/benchmarks/quant.md``).
The scratch is per thread and grows to the largest block (at most ``CHUNK_ELEMENTS``
weights), so by default the model never has a dense copy.

Where memory allows (``--prefill-dense-weights``), a layer instead keeps the dense weight once:
``int8_dense`` / ``int4_dense_t`` build it at load with the very arithmetic of the per-call
pass, so the many-row matmul multiplies by the same values and skips the pass.
"""
from __future__ import annotations

import functools
import threading
from typing import Callable

import torch
import torch.nn.functional as F

# Rows (tokens) from which a call dequantises instead of running the packed kernel. Measured
# on the 2-core AVX-512 VM with SmolLM2's shapes (benchmarks.quant --cpu-crossover).
DENSE_MIN_ROWS = {"int8": 64, "int4": 128, "int4-w4a8": 128}
# Rows from which a layer that keeps a dense copy (``--prefill-dense-weights``) multiplies by
# it: with no dequantising pass to pay, and the bf16 copy reordered once for oneDNN
# (``onednn_weight``), the copy wins far sooner. Measured on the 2-core AVX-512 VM over all
# of SmolLM2's block layers in turn, weights from memory as in a step (benchmarks.quant
# --cpu-copy-crossover): the int8 kernel's time doubles past 4 rows, where the copy ties
# from 3; the int4 kernel works in blocks of 4 rows, and the copy wins at 5-6 rows, loses
# at 7-8 and wins from 10. A copy in the plain layout (other dtypes, or no oneDNN bf16
# here) pays a reorder inside every matmul and keeps the thresholds measured for it before
# ("-plain": the copy ties at 8-12 rows for int8, at 20 for int4).
# "int4-w4a8": an int4 layer on the int4 x int8 op (``cpu_w4a8``). The matmuls alone cross
# over at 16 rows (SmolLM2's 120 layers: 14.6 against 15.1 ms at 14 rows, 16.8 against 16.2
# at 16), but below the switch a step's work between attention calls runs as the compiled
# layer pieces (``backend.engine.aot_layers``), which outweighs the op's loss up to 31 rows:
# decode steps at batch 16 / 20 / 24 / 28 37.4 / 53.2 / 55.9 / 69.5 ms against 46.4 / 63.2 /
# 58.6 / 73.4 with the switch at 16, equal at 32 and at 2-12
# (docs/benchmarks/cpu-epyc-1206/int4-w4a8/ab_copy_rows.py). A plain copy loses to the op
# for longer still (not measured): the same.
COPY_MIN_ROWS = {"int8": 4, "int4": 9, "int8-plain": 16, "int4-plain": 24,
                 "int4-w4a8": 32, "int4-w4a8-plain": 32}
# The same for an LM head (49152 x 576 for SmolLM2, 28 MB of int8 read from memory every
# step): the packed int8 kernel wins at 1-2 rows, the copy from 3 (a plain copy from 6). An
# int4 head was not measured: it keeps the block layers' thresholds.
HEAD_COPY_MIN_ROWS = {"int8": 3, "int8-plain": 6,
                      **{k: v for k, v in COPY_MIN_ROWS.items() if k.startswith("int4")}}


def few_rows_limit(kind: str) -> int:
    """Rows below which a quantised CPU layer of ``kind`` ("int4", "int8", "int4-w4a8")
    runs its packed kernel whatever copy it keeps (``Linear.few_rows_fn``)."""
    return min(DENSE_MIN_ROWS[kind], COPY_MIN_ROWS[kind], COPY_MIN_ROWS[f"{kind}-plain"])


CHUNK_ELEMENTS = 1 << 22  # weights dequantised at once: 8 MiB of bf16 scratch at most

# A nibble q becomes a float exactly by writing it into the low mantissa bits of a power of
# two (2^m + q), then subtracting 2^m + 8 gives q - 8 with no rounding: (int view, bits, 2^m).
NIBBLE_BITS = {torch.bfloat16: (torch.int16, 0x4300, 128.0),
               torch.float16: (torch.int16, 0x6400, 1024.0),
               torch.float32: (torch.int32, 0x4B000000, 8388608.0)}

_local = threading.local()


def scratch(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A per-thread buffer of ``shape`` (contents undefined), grown when too small."""
    bufs = _local.__dict__.setdefault("bufs", {})
    n = 1
    for s in shape:
        n *= s
    buf = bufs.get((name, dtype))
    if buf is None or buf.numel() < n:
        # a normal tensor even when first asked for under torch.inference_mode (the engine):
        # an inference tensor could not be written by a later caller outside it (tools,
        # tests in the same process)
        with torch.inference_mode(False):
            buf = bufs[(name, dtype)] = torch.empty(n, dtype=dtype)
    return buf[:n].view(shape)


def row_blocks(n_rows: int, in_features: int, align: int) -> list[tuple[int, int]]:
    """(n0, n1) blocks of output rows, multiples of ``align``, of about ``CHUNK_ELEMENTS``
    weights each: what one dequantising pass writes at once."""
    step = max(align, (CHUNK_ELEMENTS // in_features) // align * align)
    return [(a, min(a + step, n_rows)) for a in range(0, n_rows, step)]


def blockwise(x: torch.Tensor, n_rows: int, blocks: list[tuple[int, int]], fn
              ) -> torch.Tensor:
    """y [T, N] from fn(n0, n1) -> y[:, n0:n1]; one block returns fn's result itself."""
    if len(blocks) == 1:
        return fn(*blocks[0])
    y = torch.empty(x.shape[0], n_rows, dtype=x.dtype)
    for n0, n1 in blocks:
        y[:, n0:n1] = fn(n0, n1)
    return y


def int8_matmul(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [T, K] @ (q [N, K] int8 * scale [N]).T -> [T, N]; the scale is per output row, so
    it is applied to the output (int8 -> float is exact)."""
    return widened_matmul(x, q) * scale


def widened_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [T, K] @ w.T for a weight w [N, K] held in a narrower dtype than x (int8 codes,
    fp16 under float32): converted into the scratch buffer block by block, then the dense
    matmul. A fresh float32 copy per call cost its page faults too: 512-token prefills 15 %
    slower than float32 weights (SmolLM2, 2-core AVX2 VM)."""
    N, K = w.shape

    def block(n0: int, n1: int) -> torch.Tensor:
        buf = scratch("w", (n1 - n0, K), x.dtype)
        buf.copy_(w[n0:n1])
        return F.linear(x, buf)

    return blockwise(x, N, row_blocks(N, K, 1), block)


def onednn_weight(w: torch.Tensor) -> torch.Tensor | None:
    """A bf16 weight w [N, K] reordered once into oneDNN's blocked layout, for
    ``onednn_linear``; None where oneDNN cannot take it (another dtype, no bf16 support,
    a torch without these ops).

    A plain bf16 weight is reordered into that layout inside every oneDNN matmul call: for
    SmolLM2's 120 block layers at 8 rows 20.3 ms through ``x @ w`` against 10.1 ms on the
    reordered copy, 278 against 261 ms at 512 rows, and the 49152 x 576 LM head 4.4 against
    2.3 ms at 8 rows (2-core AVX-512 VM, weights from memory; docs/BENCHMARKS.md). The
    values, and in bf16 the results' bits, are those of the plain matmul."""
    if w.dtype != torch.bfloat16 or w.device.type != "cpu" or not onednn_bf16():
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), 8)
    except RuntimeError:  # a weight this oneDNN refuses keeps the plain layout
        return None


@functools.lru_cache(maxsize=None)
def onednn_bf16() -> bool:
    """Whether this torch and CPU run bf16 matmuls in oneDNN from a reordered weight
    (``onednn_weight``), checked on a probe: results equal to the plain matmul's."""
    try:
        if not (torch.backends.mkldnn.is_available()
                and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
            return False
        gen = torch.Generator().manual_seed(0)
        w = torch.randn(48, 32, generator=gen).to(torch.bfloat16)
        x = torch.randn(3, 32, generator=gen).to(torch.bfloat16)
        got = onednn_linear(x, torch.ops.mkldnn._reorder_linear_weight(w, 8))
    except (AttributeError, RuntimeError):  # a torch without these private ops
        return False
    return torch.allclose(got.float(), F.linear(x, w).float(), rtol=1e-2, atol=1e-2)


def onednn_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [T, K] @ W.T for W from ``onednn_weight``."""
    return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")


def int8_dense(q: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The codes q [N, K] as floats in ``dtype`` (exact: |q| <= 128 fits every float's
    mantissa), kept whole: ``F.linear(x, w) * scale`` then equals ``int8_matmul``."""
    return q.to(dtype)


@functools.lru_cache(maxsize=None)
def int4_block_n() -> int:
    """The row block of ``_convert_weight_to_int4pack_for_cpu``'s layout on this CPU (see
    ``int4_unpack``): torch packs 64 rows a block where its kernel uses AVX-512 and 32
    elsewhere. 0 when neither reads a probe back (another torch's layout)."""
    codes = torch.randint(0, 16, (64, 32), generator=torch.Generator().manual_seed(0),
                          dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    for block in (64, 32):
        if packed.shape == (64, 16) and torch.equal(
                _unpack(packed, 64, 32, block), codes.to(torch.uint8)):
            return block
    return 0


def int4_layout_ok(packed: torch.Tensor, codes: torch.Tensor) -> bool:
    """Whether ``packed`` (from ``_convert_weight_to_int4pack_for_cpu``) holds ``codes``
    [N, K] in the layout ``int4_unpack`` reads; checked once per layer at load, so another
    torch version's layout turns this path off instead of giving wrong weights."""
    N, K = codes.shape
    block = int4_block_n()
    if not block or N % block or packed.shape != (N, K // 2) or packed.dtype != torch.uint8:
        return False
    return torch.equal(int4_unpack(packed, N, K), codes.to(torch.uint8))


def int4_unpack(packed: torch.Tensor, N: int, K: int) -> torch.Tensor:
    """Codes uint8 [N, K] from the packed layout: per block of B rows (``int4_block_n``)
    and per input k, B / 2 bytes whose low nibbles are the block's first B / 2 rows and
    high nibbles the rest."""
    return _unpack(packed, N, K, int4_block_n())


def _unpack(packed: torch.Tensor, N: int, K: int, block: int) -> torch.Tensor:
    p = packed.view(N // block, K, block // 2)
    rows = torch.cat([p & 15, p >> 4], dim=2)  # [N / B, K, B]
    return rows.permute(0, 2, 1).reshape(N, K)


# (name, shape, dtype) -> a buffer of that shape whose contents may be overwritten
Alloc = Callable[[str, tuple[int, ...], torch.dtype], torch.Tensor]


def fresh(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype)


def _int4_block_t(packed: torch.Tensor, scale_zero: torch.Tensor, group_size: int,
                  n0: int, n1: int, dtype: torch.dtype, alloc: Alloc) -> torch.Tensor:
    """W.T [K, n1 - n0] in ``dtype`` for output rows n0..n1 (multiples of the packing's
    row block), W[n, k] = (q - 8) * scale + zero; the one place both the per-call pass and
    the kept dense copy compute it, so the two give the same bits."""
    N, K = packed.shape[0], packed.shape[1] * 2
    G, B = group_size, int4_block_n()
    int_dtype, bits, base = NIBBLE_BITS[dtype]
    p = packed.view(N // B, K, B // 2)
    nb = (n1 - n0) // B
    src = p[n0 // B:n1 // B].permute(1, 0, 2)  # [K, nb, B / 2] bytes
    wide = alloc("bytes", (K, nb, B // 2), int_dtype)
    wide.copy_(src)
    w = alloc("w", (K, nb, 2, B // 2), dtype)  # W.T [K, n1 - n0], row blocks of B
    bits_view = w.view(int_dtype)
    torch.bitwise_and(wide, 15, out=bits_view[:, :, 0])
    torch.bitwise_right_shift(wide, 4, out=bits_view[:, :, 1])
    bits_view.bitwise_or_(bits)  # 2^m + q
    w.sub_(base + 8)  # q - 8, exact
    # The interleaved scale/zero pairs, split into contiguous rows (strided operands
    # make addcmul several times slower).
    sz = alloc("scale_zero", (2, K // G, n1 - n0), dtype)
    sz.copy_(scale_zero[:, n0:n1].permute(2, 0, 1))
    wg = w.view(K // G, G, n1 - n0)
    torch.addcmul(sz[1].unsqueeze(1), wg, sz[0].unsqueeze(1), out=wg)
    return w.view(K, n1 - n0)


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, scale_zero: torch.Tensor,
                group_size: int) -> torch.Tensor:
    """x [T, K] @ W.T with W[n, k] = (q - 8) * scale + zero (tinygemm's convention);
    ``scale_zero`` [K / G, N, 2] as the packed kernel takes it."""
    N, K = packed.shape[0], packed.shape[1] * 2

    def block(n0: int, n1: int) -> torch.Tensor:
        return x @ _int4_block_t(packed, scale_zero, group_size, n0, n1, x.dtype, scratch)

    return blockwise(x, N, row_blocks(N, K, int4_block_n()), block)


def int4_dense_t(packed: torch.Tensor, scale_zero: torch.Tensor, group_size: int,
                 dtype: torch.dtype) -> torch.Tensor:
    """The whole W.T [K, N] in ``dtype``, kept by a layer as its dense prefill copy:
    ``x @ w`` then equals ``int4_matmul`` (same values, same [K, N] operand layout). Built
    in the same blocks through fresh buffers, so the loading thread keeps no scratch."""
    N, K = packed.shape[0], packed.shape[1] * 2
    out = torch.empty(K, N, dtype=dtype)
    for n0, n1 in row_blocks(N, K, int4_block_n()):
        out[:, n0:n1] = _int4_block_t(packed, scale_zero, group_size, n0, n1, dtype, fresh)
    return out
