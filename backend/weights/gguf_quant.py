"""GGUF Q8_0 / Q4_0 / Q4_1 / Q4_K blocks read as codes + scales, without a float copy.

Block layouts (along the input dimension; ggml-quants.c):
  Q8_0: d (fp16), 32 x int8 q                       w = d * q
  Q4_0: d (fp16), 16 bytes of nibbles               w = d * (q - 8)
  Q4_1: d (fp16), m (fp16), 16 bytes of nibbles     w = d * q + m
  Q4_K: 256 weights: d, dmin (fp16), 12 bytes of eight 6-bit (scale, min) pairs, 128 bytes
        of nibbles                                  w = d * sc_j * q - dmin * m_j
In Q4_0 / Q4_1 blocks byte j holds weight j (low nibble) and weight j + 16 (high nibble); in
Q4_K each 32 bytes hold a 64-weight chunk, its first 32 weights in the low nibbles.
All four map onto ``GroupQuantized`` (value = code * scale + min, group 32); Q4_1 is exactly
our asymmetric int4 with G = 32, Q4_0 its symmetric special case, and Q4_K the same per
sub-block of 32 (scale d * sc_j, min -dmin * m_j, both exact in float32).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType

from backend.layers.quantize import GroupQuantized

BLOCK = 32
CODE_TYPES = {GGMLQuantizationType.Q8_0: "int8", GGMLQuantizationType.Q4_0: "int4",
              GGMLQuantizationType.Q4_1: "int4", GGMLQuantizationType.Q4_K: "int4"}
SUPER_BLOCK = 256  # Q4_K's weights per block


def gguf_codes(data: np.ndarray, qtype: GGMLQuantizationType) -> GroupQuantized:
    """data: the tensor's raw bytes as GGUFReader exposes them, [N, bytes per row] uint8
    -> codes [N, K] with scale / min [N, K / 32] float32 (fp16 in the file: exact)."""
    rows = np.asarray(data, dtype=np.uint8)
    N = rows.shape[0]
    if qtype == GGMLQuantizationType.Q8_0:
        blocks = rows.reshape(N, -1, 2 + BLOCK)
        d = _fp16(blocks[..., 0:2])
        codes = blocks[..., 2:].copy().view(np.int8)
        return _group(codes, d, np.zeros_like(d), 8)
    if qtype == GGMLQuantizationType.Q4_0:
        blocks = rows.reshape(N, -1, 2 + BLOCK // 2)
        d = _fp16(blocks[..., 0:2])
        return _group(_nibbles(blocks[..., 2:]), d, -8.0 * d, 4)
    if qtype == GGMLQuantizationType.Q4_1:
        blocks = rows.reshape(N, -1, 4 + BLOCK // 2)
        d, m = _fp16(blocks[..., 0:2]), _fp16(blocks[..., 2:4])
        return _group(_nibbles(blocks[..., 4:]), d, m, 4)
    if qtype == GGMLQuantizationType.Q4_K:
        return _q4_k(rows)
    raise ValueError(f"GGUF type {qtype.name} has no code form here")


def native_format(tensors: list[Any], is_linear: Any) -> str | None:
    """'int4' or 'int8' when most linear-layer weights of the file are Q4_0/Q4_1 or Q8_0
    (what `--weights-dtype auto` keeps), else None."""
    kinds = [CODE_TYPES.get(t.tensor_type) for t in tensors if is_linear(t.name)]
    if not kinds:
        return None
    best = max(set(kinds), key=kinds.count)
    return best if kinds.count(best) * 2 > len(kinds) else None


def _q4_k(rows: np.ndarray) -> GroupQuantized:
    """Q4_K rows [N, bytes] -> codes [N, K] with a scale / min pair per 32 weights."""
    N = rows.shape[0]
    blocks = rows.reshape(N, -1, 4 + 12 + SUPER_BLOCK // 2)
    d, dmin = _fp16(blocks[..., 0:2]), _fp16(blocks[..., 2:4])
    # twelve bytes, eight 6-bit scales and mins: sub-blocks 0-3 in the low six bits of bytes
    # 0-3 (scales) and 4-7 (mins); 4-7 in the nibbles of bytes 8-11 with their top two bits
    # in the top bits of bytes 0-3 (scales) and 4-7 (mins)
    packed = blocks[..., 4:16].reshape(N, -1, 3, 4)
    lo_sc, lo_m, hi = packed[..., 0, :], packed[..., 1, :], packed[..., 2, :]
    sc = np.concatenate([lo_sc & 63, (hi & 15) | ((lo_sc >> 6) << 4)], axis=-1)
    mn = np.concatenate([lo_m & 63, (hi >> 4) | ((lo_m >> 6) << 4)], axis=-1)
    qs = blocks[..., 16:].reshape(N, -1, 4, 1, 32)                # [N, nb, chunk, 1, byte]
    codes = np.concatenate((qs & 15, qs >> 4), axis=3)            # [N, nb, chunk, half, 32]
    scale = d[..., None] * sc.astype(np.float32)                  # [N, nb, 8]: exact
    lo = -(dmin[..., None] * mn.astype(np.float32))
    return _group(codes.reshape(N, -1), scale.reshape(N, -1), lo.reshape(N, -1), 4)


def _fp16(two_bytes: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(two_bytes).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[N, B, 16] bytes -> [N, B, 32] codes 0..15 (low nibbles first, then high)."""
    return np.concatenate((qs & 15, qs >> 4), axis=-1)


def _group(codes: np.ndarray, d: np.ndarray, m: np.ndarray, bits: int) -> GroupQuantized:
    N = codes.shape[0]
    return GroupQuantized(torch.from_numpy(np.ascontiguousarray(codes).reshape(N, -1)),
                          torch.from_numpy(np.ascontiguousarray(d)),
                          torch.from_numpy(np.ascontiguousarray(m)), BLOCK, bits)
