"""Paged attention over a flat token batch (varlen): decodes first, then prefill chunks.

One step's tokens are laid out flat, ``[T]``: the first ``num_decode`` are single-token
decodes of different sequences, then each prefill chunk's tokens in turn. Every layer:
1. writes the step's K/V into the paged cache (``slot_mapping``),
2. decodes: gathers each sequence's context from the cache at once (padded to the longest,
   masked) and runs one attention call for all of them,
3. prefills: one attention call per chunk over its cached context plus itself (causal with
   an offset). A step holds few chunks, so the per-chunk call is cheap next to its matmuls.

GQA without copying K/V per query head: the ``group`` query heads that share a KV head are
folded into the query-length axis, so SDPA sees ``num_kv_heads`` heads on both sides.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from backend.engine.kv_cache import KVCache


@dataclass
class PrefillChunk:
    q_start: int  # first row of this chunk in the flat batch
    q_len: int
    ctx_idx: torch.Tensor  # [ctx] slot indices of positions 0..ctx-1 (chunk included)
    mask: torch.Tensor  # [1, 1, group * q_len, ctx] additive: 0 = attend, -inf = not


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] long: cache slot of each token of the step
    num_decode: int = 0
    decode_ctx_idx: torch.Tensor | None = None  # [D, C] long slot indices (padding -> 0)
    # [D, 1, 1, C] additive (0 / -inf); None when every row uses all C positions
    decode_mask: torch.Tensor | None = None
    prefills: list[PrefillChunk] = field(default_factory=list)


def causal_chunk_mask(start: int, q_len: int, group: int, device: torch.device,
                      dtype: torch.dtype) -> torch.Tensor:
    """[1, 1, group * q_len, start + q_len] additive mask: query i (at position start + i)
    sees keys <= it. Additive float, built once per step: SDPA would otherwise convert a
    boolean mask to this form again in every layer."""
    ctx = start + q_len
    rows = torch.arange(start, ctx, device=device).unsqueeze(1)  # [q, 1]
    blocked = torch.arange(ctx, device=device).unsqueeze(0) > rows  # [q, ctx]
    mask = torch.zeros(q_len, ctx, dtype=dtype, device=device).masked_fill_(blocked, -torch.inf)
    return mask.repeat(group, 1).view(1, 1, group * q_len, ctx)


def math_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Explicit reference: softmax(q k^T * scale + mask) v, in float32."""
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask.float()
    return torch.matmul(torch.softmax(scores, dim=-1), v.float()).to(q.dtype)


class PagedAttention:
    """Attention for all layers; holds no weights, only the kernel choice and the cache."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, backend: str,
                 kv_cache: KVCache, sdpa_context: Callable[[], contextlib.AbstractContextManager]
                 | None = None) -> None:
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.group = num_heads // num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim ** -0.5
        self.backend = backend
        self.kv_cache = kv_cache
        # On CUDA: a sdpa_kernel(...) context restricting SDPA to the backend the startup
        # probe verified, so it can never fall back silently.
        self.sdpa_context = sdpa_context

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        if self.backend == "math":
            return math_attention(q, k, v, mask, self.scale)
        if self.sdpa_context is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        with self.sdpa_context():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)

    def forward(self, layer: int, q: torch.Tensor, kv: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """q: [T, H, hd]; kv: [T, 2, kvh, hd] (RoPE applied) -> [T, H * hd]."""
        self.kv_cache.write(layer, meta.slot_mapping, kv)
        T = q.shape[0]
        if not meta.prefills:  # pure decode step: no output buffer, no copies
            return self._decode(layer, q, meta).view(T, self.num_heads * self.head_dim)
        out = torch.empty(T, self.num_heads, self.head_dim, dtype=q.dtype, device=q.device)
        d = meta.num_decode
        if d:
            out[:d] = self._decode(layer, q[:d], meta)
        for chunk in meta.prefills:
            rows = slice(chunk.q_start, chunk.q_start + chunk.q_len)
            out[rows] = self._prefill(layer, q[rows], chunk)
        return out.view(T, self.num_heads * self.head_dim)

    def _decode(self, layer: int, q: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        D = q.shape[0]
        kv = self.kv_cache.gather(layer, meta.decode_ctx_idx)  # [D, C, 2, kvh, hd]
        k = kv[:, :, 0].transpose(1, 2)  # [D, kvh, C, hd]
        v = kv[:, :, 1].transpose(1, 2)
        qg = q.view(D, self.num_kv_heads, self.group, self.head_dim)  # [D, kvh, g, hd]
        o = self._attend(qg, k, v, meta.decode_mask)  # [D, kvh, g, hd]
        return o.reshape(D, self.num_heads, self.head_dim)

    def _prefill(self, layer: int, q: torch.Tensor, chunk: PrefillChunk) -> torch.Tensor:
        n = q.shape[0]
        kv = self.kv_cache.gather(layer, chunk.ctx_idx)  # [ctx, 2, kvh, hd]
        k = kv[:, 0].transpose(0, 1).unsqueeze(0)  # [1, kvh, ctx, hd]
        v = kv[:, 1].transpose(0, 1).unsqueeze(0)
        # [n, H, hd] -> [1, kvh, g * n, hd]: rows ordered (group member, position)
        qg = q.view(n, self.num_kv_heads, self.group, self.head_dim).permute(1, 2, 0, 3)
        qg = qg.reshape(1, self.num_kv_heads, self.group * n, self.head_dim)
        o = self._attend(qg, k, v, chunk.mask)  # [1, kvh, g * n, hd]
        o = o.view(self.num_kv_heads, self.group, n, self.head_dim).permute(2, 0, 1, 3)
        return o.reshape(n, self.num_heads, self.head_dim)
